"""Sampler components against Hugging Face transformers' logits processors, side by side.

Logits are random with deliberate ties (values rounded to a coarse grid, so many tokens
share a value) and some rows already filtered to -inf, as they are after an earlier step.
The later tests pin the boundaries and refusals: which tokens survive a filter is worked out by
hand for small, exactly representable distributions, not taken from the implementation.
"""

from __future__ import annotations

import math

from pydantic import ValidationError
import pytest
import torch

from specformer.errors import SpecError
from specformer.registry.discovery import get_registry
from specformer_generate import build_sampler
from specformer_generate.samplers.constraint import Choice, Grammar, JsonSchema, Regex
from specformer_generate.samplers.greedy import Greedy
from specformer_generate.samplers.min_p import MinP
from specformer_generate.samplers.no_repeat_ngram import NoRepeatNGram
from specformer_generate.samplers.params import (FrequencyPenaltyParams, MinPParams, NoRepeatNGramParams,
                                                 PresencePenaltyParams, RepetitionPenaltyParams, TemperatureParams,
                                                 TopKParams, TopPParams, TypicalParams)
from specformer_generate.samplers.penalties import FrequencyPenalty, PresencePenalty
from specformer_generate.samplers.pipeline import Sampler, draw
from specformer_generate.samplers.repetition import RepetitionPenalty
from specformer_generate.samplers.temperature import Temperature
from specformer_generate.samplers.top_k import TopK
from specformer_generate.samplers.top_p import TopP
from specformer_generate.samplers.typical import Typical

hf = pytest.importorskip("transformers.generation.logits_process")

VOCAB = 50


def tied_logits(seed: int, batch: int = 6, vocab: int = VOCAB) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, vocab, generator=g) * 3
    logits[: batch // 2] = (logits[: batch // 2] * 2).round() / 2  # many exact ties
    logits[-1, : vocab // 2] = float("-inf")  # a row an earlier step already filtered
    return logits


def history(seed: int, batch: int = 6, length: int = 12, vocab: int = VOCAB) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 1000)
    return torch.randint(0, vocab // 5, (batch, length), generator=g)  # small range: many repeats


SEEDS = range(8)


def assert_same(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("value", [0.3, 1.0, 2.5])
def test_temperature_matches_transformers(seed: int, value: float) -> None:
    logits, ids = tied_logits(seed), history(seed)
    assert_same(Temperature(TemperatureParams(value=value))(logits, ids), hf.TemperatureLogitsWarper(value)(ids, logits.clone()))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("k, keep", [(1, 1), (3, 1), (7, 1), (2, 5), (VOCAB + 10, 1)])
def test_top_k_matches_transformers(seed: int, k: int, keep: int) -> None:
    logits, ids = tied_logits(seed), history(seed)
    ours = TopK(TopKParams(k=k, min_tokens_to_keep=keep))(logits, ids)
    assert_same(ours, hf.TopKLogitsWarper(k, min_tokens_to_keep=keep)(ids, logits.clone()))


def test_top_k_keeps_every_token_tied_with_the_kth() -> None:
    logits = torch.tensor([[3.0, 1.0, 2.0, 2.0, 2.0, 0.0]])
    out = TopK(TopKParams(k=2))(logits, torch.zeros(1, 0, dtype=torch.long))
    assert torch.isfinite(out).tolist() == [[True, False, True, True, True, False]]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("p, keep", [(0.05, 1), (0.5, 1), (0.9, 1), (1.0, 1), (0.3, 4)])
def test_top_p_matches_transformers(seed: int, p: float, keep: int) -> None:
    logits, ids = tied_logits(seed), history(seed)
    ours = TopP(TopPParams(p=p, min_tokens_to_keep=keep))(logits, ids)
    assert_same(ours, hf.TopPLogitsWarper(p, min_tokens_to_keep=keep)(ids, logits.clone()))


def test_top_p_formula_on_a_small_example() -> None:
    # probabilities 1/2, 1/4, 1/8, 1/8: p = 3/4 keeps the first two (1/2 + 1/4 reaches 3/4 exactly;
    # the two below hold 1/4 = 1 - p, so they go). Powers of two keep the boundary exact on every
    # kernel: the float32 logits are -k ln 2, whose softmax is exactly these probabilities.
    logits = torch.tensor([[0.5, 0.25, 0.125, 0.125]]).log()
    assert logits.softmax(-1).tolist() == [[0.5, 0.25, 0.125, 0.125]]
    out = TopP(TopPParams(p=0.75))(logits, torch.zeros(1, 0, dtype=torch.long))
    assert torch.isfinite(out).tolist() == [[True, True, False, False]]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("p, keep", [(0.0, 1), (0.05, 1), (0.3, 1), (1.0, 1), (0.9, 3)])
def test_min_p_matches_transformers(seed: int, p: float, keep: int) -> None:
    logits, ids = tied_logits(seed), history(seed)
    ours = MinP(MinPParams(p=p, min_tokens_to_keep=keep))(logits, ids)
    assert_same(ours, hf.MinPLogitsWarper(p, min_tokens_to_keep=keep)(ids, logits.clone()))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("p, keep", [(0.1, 1), (0.5, 1), (0.95, 1), (0.2, 6)])
def test_typical_matches_transformers(seed: int, p: float, keep: int) -> None:
    logits, ids = tied_logits(seed), history(seed)
    ours = Typical(TypicalParams(p=p, min_tokens_to_keep=keep))(logits, ids)
    assert_same(ours, hf.TypicalLogitsWarper(p, min_tokens_to_keep=keep)(ids, logits.clone()))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("penalty", [0.5, 1.0, 1.3, 3.0])
def test_repetition_penalty_matches_transformers(seed: int, penalty: float) -> None:
    logits, ids = tied_logits(seed), history(seed)
    ours = RepetitionPenalty(RepetitionPenaltyParams(penalty=penalty))(logits, ids)
    assert_same(ours, hf.RepetitionPenaltyLogitsProcessor(penalty)(ids, logits.clone()))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_no_repeat_ngram_matches_transformers(seed: int, n: int) -> None:
    logits = tied_logits(seed)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 4, (6, 20), generator=g)  # 4 symbols: n-grams repeat often
    ours = NoRepeatNGram(NoRepeatNGramParams(n=n))(logits, ids)
    assert_same(ours, hf.NoRepeatNGramLogitsProcessor(n)(ids, logits.clone()))


def test_no_repeat_ngram_short_history_bans_nothing() -> None:
    logits = tied_logits(0)
    assert_same(NoRepeatNGram(NoRepeatNGramParams(n=4))(logits, history(0, length=3)), logits)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("frequency, presence", [(0.5, 0.0), (0.0, 0.7), (1.2, -0.4), (-2.0, 2.0)])
def test_frequency_and_presence_penalties_follow_the_openai_formula(seed: int, frequency: float, presence: float) -> None:
    logits, ids = tied_logits(seed), history(seed)
    expected = logits.clone()
    for row in range(ids.shape[0]):
        for token in range(VOCAB):
            count = int((ids[row] == token).sum())
            expected[row, token] = logits[row, token] - count * frequency - (1.0 if count > 0 else 0.0) * presence
    sampler = Sampler([FrequencyPenalty(FrequencyPenaltyParams(penalty=frequency)),
                       PresencePenalty(PresencePenaltyParams(penalty=presence))])
    torch.testing.assert_close(sampler.process(logits, ids), expected)


HISTORY_STEPS = [
    lambda: RepetitionPenalty(RepetitionPenaltyParams(penalty=1.7)),
    lambda: FrequencyPenalty(FrequencyPenaltyParams(penalty=0.9)),
    lambda: PresencePenalty(PresencePenaltyParams(penalty=1.1)),
    lambda: NoRepeatNGram(NoRepeatNGramParams(n=2)),
    lambda: NoRepeatNGram(NoRepeatNGramParams(n=1)),
]


@pytest.mark.parametrize("make", HISTORY_STEPS)
def test_history_steps_ignore_left_padding(make) -> None:
    """Negative ids are padding: a padded row is processed exactly like the row alone."""
    logits, ids = tied_logits(3), history(3, length=10)
    padded = torch.cat((torch.full((ids.shape[0], 4), -1), ids), dim=1)
    step = make()
    assert_same(step(logits, padded), step(logits, ids))


@pytest.mark.parametrize("make", HISTORY_STEPS)
def test_history_steps_ignore_ids_beyond_the_vocabulary(make) -> None:
    logits, ids = tied_logits(4), history(4, length=10)
    widened = torch.cat((ids, torch.full((ids.shape[0], 1), VOCAB + 3)), dim=1)
    step = make()
    if isinstance(step, NoRepeatNGram):  # an out-of-vocabulary id also changes the n-gram prefix
        widened = torch.cat((torch.full((ids.shape[0], 1), VOCAB + 3), ids), dim=1)
    assert_same(step(logits, widened), step(logits, ids))


def test_composition_runs_in_the_order_written() -> None:
    logits, ids = tied_logits(5), history(5)
    a = build_sampler([{"kind": "temperature", "value": 0.5}, {"kind": "top_p", "p": 0.6}])
    b = build_sampler([{"kind": "top_p", "p": 0.6}, {"kind": "temperature", "value": 0.5}])
    expected_a = hf.TopPLogitsWarper(0.6)(ids, hf.TemperatureLogitsWarper(0.5)(ids, logits.clone()))
    expected_b = hf.TemperatureLogitsWarper(0.5)(ids, hf.TopPLogitsWarper(0.6)(ids, logits.clone()))
    assert_same(a.process(logits, ids), expected_a)
    assert_same(b.process(logits, ids), expected_b)
    assert not torch.equal(torch.isinf(expected_a), torch.isinf(expected_b))  # the order matters here


BUILTIN_SAMPLERS = {
    "temperature": Temperature, "top_k": TopK, "top_p": TopP, "min_p": MinP, "typical": Typical,
    "repetition_penalty": RepetitionPenalty, "frequency_penalty": FrequencyPenalty,
    "presence_penalty": PresencePenalty, "no_repeat_ngram": NoRepeatNGram, "greedy": Greedy,
    "regex": Regex, "choice": Choice, "json_schema": JsonSchema, "grammar": Grammar,
}


def test_every_builtin_sampler_is_registered_with_its_params() -> None:
    registry = get_registry()
    assert {c.name for c in registry if c.kind == "sampler" and c.plugin == "generate"} == set(BUILTIN_SAMPLERS)
    assert registry.kinds["sampler"].sizes == ()  # the generate plugin's own kind: samplers receive no size
    for name, cls in BUILTIN_SAMPLERS.items():
        component = registry.get("sampler", name)
        assert component.params is cls.Params
        assert component.plugin == "generate"
        assert component.doc


@pytest.mark.parametrize(
    "entry, path",
    [
        ({"kind": "top_p", "p": 1.5}, "sampler[0].p"),
        ({"kind": "top_p", "p": 0.0}, "sampler[0].p"),
        ({"kind": "top_k", "k": 0}, "sampler[0].k"),
        ({"kind": "top_k", "k": 4, "min_tokens_to_keep": 0}, "sampler[0].min_tokens_to_keep"),
        ({"kind": "temperature", "value": -0.5}, "sampler[0].value"),
        ({"kind": "temperature", "value": 0}, "sampler[0].value"),
        ({"kind": "temperature"}, "sampler[0].value"),
        ({"kind": "min_p", "p": -0.1}, "sampler[0].p"),
        ({"kind": "typical", "p": 1.0}, "sampler[0].p"),
        ({"kind": "repetition_penalty", "penalty": 0}, "sampler[0].penalty"),
        ({"kind": "frequency_penalty", "penalty": 2.5}, "sampler[0].penalty"),
        ({"kind": "presence_penalty", "penalty": -3}, "sampler[0].penalty"),
        ({"kind": "no_repeat_ngram", "n": 0}, "sampler[0].n"),
        ({"kind": "top_k", "k": 3, "kk": 1}, "sampler[0].kk"),
        ({"kind": "top_kk", "k": 3}, "sampler[0].kind"),
        (3, "sampler[0]"),
    ],
)
def test_bad_params_are_spec_errors_naming_the_field(entry, path: str) -> None:
    with pytest.raises(SpecError) as info:
        build_sampler([entry])
    assert [p.path for p in info.value.problems] == [path]


def test_params_models_reject_bad_values_directly() -> None:
    with pytest.raises(ValidationError):
        TopP.Params(p=1.5)
    with pytest.raises(ValidationError):
        TopK.Params(k=0)
    with pytest.raises(ValidationError):
        Temperature.Params(value=-1.0)


def test_greedy_must_be_last() -> None:
    with pytest.raises(SpecError, match="must be the last entry"):
        build_sampler(["greedy", {"kind": "top_k", "k": 3}])
    assert build_sampler([{"kind": "top_k", "k": 3}, "greedy"]).is_greedy


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(SpecError) as info:
        build_sampler([{"kind": "top_p", "p": 2}, {"kind": "top_k", "k": 3}, {"kind": "nope"}])
    assert [p.path for p in info.value.problems] == ["sampler[0].p", "sampler[2].kind"]


def test_none_is_greedy_and_a_list_without_greedy_draws() -> None:
    logits = tied_logits(6)
    ids = history(6)
    assert build_sampler(None).is_greedy
    assert torch.equal(build_sampler(None).sample(logits, ids), logits.argmax(-1))
    assert not build_sampler([]).is_greedy
    # Repetition penalty then greedy: the argmax of the penalised logits.
    sampler = build_sampler([{"kind": "repetition_penalty", "penalty": 5.0}, "greedy"])
    expected = hf.RepetitionPenaltyLogitsProcessor(5.0)(ids, logits.clone()).argmax(-1)
    assert torch.equal(sampler.sample(logits, ids), expected)


def test_draw_follows_the_softmax_distribution() -> None:
    """Empirical frequencies of 40,000 draws against softmax(logits), within 5 standard errors."""
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, float("-inf"), -1.0])
    n = 40_000
    g = torch.Generator().manual_seed(0)
    tokens = draw(logits.expand(n, -1), g)
    freq = torch.bincount(tokens, minlength=6).double() / n
    p = torch.softmax(logits.double(), dim=0)
    stderr = (p * (1 - p) / n).sqrt()
    assert freq[4] == 0  # a filtered token is never drawn
    assert ((freq - p).abs() <= 5 * stderr + 1e-12).all(), (freq, p)


def test_top_k_then_draw_never_leaves_the_top_k() -> None:
    logits = tied_logits(7, batch=1).expand(2000, -1)
    sampler = build_sampler([{"kind": "top_k", "k": 3}])
    tokens = sampler.sample(logits, torch.zeros(2000, 0, dtype=torch.long), torch.Generator().manual_seed(1))
    allowed = torch.topk(logits[0], 3).values[-1]
    assert (logits[0, tokens] >= allowed).all()
    assert len(set(tokens.tolist())) >= 3


def test_sampling_is_repeatable_with_a_seeded_generator() -> None:
    logits, ids = tied_logits(8), history(8)
    sampler = build_sampler([{"kind": "temperature", "value": 1.5}])
    a = sampler.sample(logits, ids, torch.Generator().manual_seed(3))
    b = sampler.sample(logits, ids, torch.Generator().manual_seed(3))
    assert torch.equal(a, b)


def test_process_checks_shapes() -> None:
    sampler = build_sampler([{"kind": "top_k", "k": 2}])
    with pytest.raises(ValueError, match="logits must be"):
        sampler.process(torch.zeros(3), torch.zeros(1, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="input_ids must be"):
        sampler.process(torch.zeros(2, 5), torch.zeros(3, 2, dtype=torch.long))


def test_typical_keeps_mass_p_of_the_most_typical_tokens() -> None:
    """The definition written out: rank by |-log p - H|, keep until the mass reaches p."""
    logits = torch.tensor([[2.0, 1.5, 0.3, -0.2, -1.0, -3.0]])
    p = torch.softmax(logits[0].double(), 0)
    entropy = -(p * p.log()).sum()
    order = sorted(range(6), key=lambda i: abs(-math.log(p[i]) - entropy))
    kept, mass = [], 0.0
    for i in order:
        kept.append(i)
        mass += float(p[i])
        if mass >= 0.6:
            break
    out = Typical(TypicalParams(p=0.6))(logits, torch.zeros(1, 0, dtype=torch.long))
    assert sorted(torch.isfinite(out[0]).nonzero().flatten().tolist()) == sorted(kept)


# -- filtered tokens stay impossible whatever follows (issue 14) ----------------------------

FILTERS = [{"kind": "top_k", "k": 3}, {"kind": "top_p", "p": 0.3}, {"kind": "min_p", "p": 0.5}]
RESCALERS = [
    {"kind": "temperature", "value": 1e-30},  # overflows float32 without saturation
    {"kind": "temperature", "value": 1e30},  # flattens every kept logit to 0
    {"kind": "temperature", "value": 0.5},
    {"kind": "repetition_penalty", "penalty": 1e-30},
    {"kind": "frequency_penalty", "penalty": -2.0},
]


def kept_by(entry: dict, logits: torch.Tensor) -> set[int]:
    """The tokens a filter keeps on ``logits`` (1, V), written out from its definition."""
    p = torch.softmax(logits[0].double(), 0)
    if entry["kind"] == "top_k":
        kth = torch.sort(logits[0], descending=True).values[entry["k"] - 1]
        return {j for j in range(logits.shape[1]) if logits[0, j] >= kth}
    if entry["kind"] == "min_p":
        return {j for j in range(logits.shape[1]) if p[j] >= entry["p"] * p.max()}
    # top_p: the likeliest tokens until their mass reaches p
    kept, mass = set(), 0.0
    for j in sorted(range(logits.shape[1]), key=lambda j: -p[j]):
        kept.add(j)
        mass += float(p[j])
        if mass >= entry["p"]:
            return kept
    return kept


@pytest.mark.parametrize("rescaler", RESCALERS, ids=lambda e: f"{e['kind']}={list(e.values())[1]}")
@pytest.mark.parametrize("entry", FILTERS, ids=lambda e: e["kind"])
def test_no_later_step_brings_a_filtered_token_back(entry: dict, rescaler: dict) -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, VOCAB, generator=g) * 3
    ids = torch.arange(VOCAB)[None, ::2]  # half the vocabulary "already seen" (for the penalties)
    kept = kept_by(entry, logits)
    assert 1 <= len(kept) < VOCAB
    # (A step before the filter would change what the filter sees, except a moderate temperature before top_k.)
    moderate = {"kind": "temperature", "value": 0.5}
    orders = [[entry, rescaler], [entry, rescaler, rescaler]]
    orders += [[moderate, entry, rescaler]] if entry["kind"] == "top_k" else []
    for steps in orders:
        sampler = build_sampler(steps)
        n = 3000
        tokens = sampler.sample(logits.expand(n, -1), ids.expand(n, -1), torch.Generator().manual_seed(1))
        assert set(tokens.tolist()) <= kept, (steps, set(tokens.tolist()) - kept)
        processed = sampler.process(logits, ids)
        assert not torch.isnan(processed).any()
        assert {j for j in range(VOCAB) if not torch.isneginf(processed[0, j])} <= kept


def test_an_infinite_temperature_is_refused_with_its_path() -> None:
    for value in (float("inf"), float("nan")):
        with pytest.raises(SpecError) as info:
            build_sampler([{"kind": "top_k", "k": 3}, {"kind": "temperature", "value": value}])
        assert [p.path for p in info.value.problems] == ["sampler[1].value"]
        assert "finite" in str(info.value)
        with pytest.raises(ValidationError, match="finite"):
            TemperatureParams(value=value)


def test_a_tiny_temperature_saturates_to_the_argmax_instead_of_nan() -> None:
    logits = torch.tensor([[1.0, 3.0, -2.0, float("-inf"), 0.5]])
    out = Temperature(TemperatureParams(value=1e-40))(logits, torch.zeros(1, 0, dtype=torch.long))
    big = torch.finfo(torch.float32).max
    assert out.tolist() == [[big, big, -big, float("-inf"), big]]
    tokens = build_sampler([{"kind": "top_k", "k": 1}, {"kind": "temperature", "value": 1e-40}]).sample(
        logits.expand(200, -1), torch.zeros(200, 0, dtype=torch.long), torch.Generator().manual_seed(0))
    assert set(tokens.tolist()) == {1}


def test_a_processor_that_makes_nan_or_inf_cannot_revive_filtered_tokens() -> None:
    """Third-party steps may be careless: -inf * 0 is NaN, z * inf is +inf. Filtered stays filtered,
    and among tokens a step made certain (+inf) the draw is uniform."""
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, -3.0, 0.0]])
    top3 = {0, 1, 2}
    n = 6000
    for careless, expected in ((lambda z, ids: z * 0.0, top3), (lambda z, ids: z * float("inf"), top3)):
        sampler = Sampler([TopK(TopKParams(k=3)), careless])
        tokens = sampler.sample(logits.expand(n, -1), torch.zeros(n, 0, dtype=torch.long),
                                torch.Generator().manual_seed(2))
        freq = torch.bincount(tokens, minlength=6).double() / n
        assert {j for j in range(6) if freq[j] > 0} == expected
        # uniform over the three: each 1/3 within 5 standard errors
        assert ((freq[list(top3)] - 1 / 3).abs() <= 5 * math.sqrt(2 / 9 / n)).all(), freq


NO_HISTORY = torch.zeros(1, 0, dtype=torch.long)


def kept(logits: torch.Tensor) -> set[int]:
    """The token ids a filter left possible in the single row of ``logits``."""
    return {int(i) for i in torch.nonzero(torch.isfinite(logits[0])).flatten()}


def log_probs(*probs: float) -> torch.Tensor:
    """One row of logits whose softmax is ``probs`` (float64, so sums of powers of two stay exact)."""
    return torch.tensor([[math.log(p) for p in probs]], dtype=torch.float64)


# -- defaults and params: min_tokens_to_keep is 1 unless the spec says otherwise -----------


def test_default_min_tokens_to_keep_is_one_for_every_filter() -> None:
    # A clear winner: each filter set tight keeps exactly it (a default of 2 would keep two).
    logits = log_probs(0.7, 0.2, 0.1)
    assert kept(TopK(TopKParams(k=1))(logits, NO_HISTORY)) == {0}
    assert kept(TopP(TopPParams(p=0.01))(logits, NO_HISTORY)) == {0}
    assert kept(MinP(MinPParams(p=1.0))(logits, NO_HISTORY)) == {0}
    # Typical: the token nearest the entropy comes first; p tiny keeps only it.
    assert len(kept(Typical(TypicalParams(p=0.01))(logits, NO_HISTORY))) == 1


@pytest.mark.parametrize("cls, params", [
    (TopK, {"k": 1}),
    (TopP, {"p": 0.01}),
    (MinP, {"p": 1.0}),
    (Typical, {"p": 0.01}),
])
def test_the_params_pass_min_tokens_to_keep_on(cls: type, params: dict) -> None:
    sampler = cls(cls.Params(**params, min_tokens_to_keep=3))
    assert len(kept(sampler(log_probs(0.6, 0.2, 0.1, 0.06, 0.04), NO_HISTORY))) == 3


# -- bounds: each sampler's Params refuse an out-of-range setting, naming the field ----------------


@pytest.mark.parametrize("params, value, field", [
    (TemperatureParams, {"value": True}, "value"),
    (TemperatureParams, {"value": 0.0}, "value"),
    (TopPParams, {"p": 0.0}, "p"),
    (MinPParams, {"p": 1.5}, "p"),
    (TypicalParams, {"p": 0.0}, "p"),
    (TypicalParams, {"p": 1.0}, "p"),
    (TypicalParams, {"p": 1.5}, "p"),
    (RepetitionPenaltyParams, {"penalty": 0.0}, "penalty"),
    (FrequencyPenaltyParams, {"penalty": -2.5}, "penalty"),
    (FrequencyPenaltyParams, {"penalty": 2.5}, "penalty"),
    (PresencePenaltyParams, {"penalty": -2.5}, "penalty"),
    (PresencePenaltyParams, {"penalty": 2.5}, "penalty"),
    (NoRepeatNGramParams, {"n": 0}, "n"),
    (TopKParams, {"k": 2, "min_tokens_to_keep": 0}, "min_tokens_to_keep"),
    (TopPParams, {"p": 0.5, "min_tokens_to_keep": 0}, "min_tokens_to_keep"),
    (MinPParams, {"p": 0.5, "min_tokens_to_keep": 0}, "min_tokens_to_keep"),
    (TypicalParams, {"p": 0.5, "min_tokens_to_keep": 0}, "min_tokens_to_keep"),
])
def test_out_of_range_settings_are_refused_with_the_field(params: type, value: dict, field: str) -> None:
    with pytest.raises(ValidationError) as info:
        params(**value)
    assert [error["loc"] for error in info.value.errors()] == [(field,)]


@pytest.mark.parametrize("cls", [FrequencyPenalty, PresencePenalty])
def test_penalties_accept_both_ends_of_their_range(cls: type) -> None:
    for penalty in (-2.0, 2.0):
        assert cls(cls.Params(penalty=penalty)).penalty == penalty


# -- typical sampling at its boundaries ------------------------------------------------------------


def test_typical_stops_at_the_first_token_whose_cumulative_mass_reaches_p() -> None:
    # probs (1/2, 1/4, 1/8, 1/8): -log p = (ln 2, 2 ln 2, 3 ln 2, 3 ln 2), entropy 1.75 ln 2, so the
    # order by |-log p - H| is token 1 (0.25 ln 2), token 0 (0.75 ln 2), then 2 and 3 (1.25 ln 2).
    # Cumulative mass in that order: 1/4, 3/4, 7/8, 1. With p = 3/4 the mass reaches p at token 0:
    # tokens 1 and 0 are kept (transformers' TypicalLogitsWarper counts masses strictly below p).
    logits = log_probs(0.5, 0.25, 0.125, 0.125)
    assert kept(Typical(TypicalParams(p=0.75))(logits, NO_HISTORY)) == {0, 1}


def test_typical_keeps_every_token_when_only_the_last_reaches_p() -> None:
    # probs (0.5, 0.25, 0.15, 0.1): entropy 1.208 nats, so |-log p - H| = (0.515, 0.178, 0.689, 1.095):
    # order 1, 0, 2, 3 with cumulative mass 0.25, 0.75, 0.9, 1. p = 0.95 is reached only by the last.
    logits = log_probs(0.5, 0.25, 0.15, 0.1)
    assert kept(Typical(TypicalParams(p=0.95))(logits, NO_HISTORY)) == {0, 1, 2, 3}


# -- penalties keep the logits' dtype ---------------------------------------------------------------


@pytest.mark.parametrize("step", [FrequencyPenalty(FrequencyPenaltyParams(penalty=0.5)), PresencePenalty(PresencePenaltyParams(penalty=0.5))])
def test_penalties_keep_the_logits_dtype(step) -> None:
    logits = torch.zeros(1, 5, dtype=torch.bfloat16)
    history = torch.tensor([[1, 1, 3]])
    out = step(logits, history)
    assert out.dtype == torch.bfloat16
    expected = {FrequencyPenalty: [0, -1.0, 0, -0.5, 0], PresencePenalty: [0, -0.5, 0, -0.5, 0]}[type(step)]
    assert out[0].float().tolist() == expected


# -- no_repeat_ngram from the first complete n-gram -------------------------------------------------


def test_no_repeat_ngram_bans_when_the_history_is_exactly_one_ngram_long() -> None:
    # History (5, 5, 5) with n = 3 holds the 3-gram (5, 5, 5); the next token would extend the
    # prefix (5, 5), which that 3-gram starts with, so 5 is banned.
    out = NoRepeatNGram(NoRepeatNGramParams(n=3))(torch.zeros(1, 8), torch.tensor([[5, 5, 5]]))
    assert kept(out) == set(range(8)) - {5}


def test_greedy_names_itself() -> None:
    assert repr(Greedy()) == "greedy"


# -- the pipeline: building it from a spec, the filtered set, the draw --------------------------


from specformer.errors import SpecError  # noqa: E402
from specformer.registry.discovery import get_registry  # noqa: E402
from specformer_generate.samplers.pipeline import Sampler, build_sampler, draw  # noqa: E402


def problems(entries) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as info:
        build_sampler(entries, path="generate.sampler")
    return [(p.path, p.message) for p in info.value.problems]


def test_a_sampler_that_is_not_a_list_is_named_with_its_type_and_value() -> None:
    assert problems("top_k") == [("generate.sampler", "expected a list of sampler components, got str 'top_k'")]
    assert problems(5) == [("generate.sampler", "expected a list of sampler components, got int 5")]


def test_every_bad_entry_is_reported_with_its_own_path() -> None:
    found = problems([{"kind": "top_k", "k": 0}, {"kind": "nope"}, 5, {"kind": "top_k", "k": 2, "bogus": 1}])
    assert [path for path, _ in found] == [
        "generate.sampler[0].k", "generate.sampler[1].kind", "generate.sampler[2]", "generate.sampler[3].bogus"]
    assert found[0][1] == "Input should be greater than 0 (got 0)"
    assert found[1][1].startswith("unknown sampler 'nope'; registered sampler components: ")
    assert found[2][1] == "expected a component as a name or a mapping with 'kind', got 5"
    assert found[3][1] == "unknown field; accepted: k, min_tokens_to_keep"


def test_a_choosing_entry_before_the_end_is_a_spec_problem_counting_what_follows() -> None:
    assert problems([{"kind": "temperature", "value": 0.5}, "greedy",
                     {"kind": "top_k", "k": 3}, {"kind": "top_p", "p": 0.5}]) == [
        ("generate.sampler", "sampler entry 1 (greedy) chooses the token itself, so it must be the last entry; "
                             "got it before 2 more")]


def test_already_resolved_entries_are_used_as_they_are() -> None:
    resolved = get_registry().resolve("sampler", {"kind": "top_k", "k": 2})
    sampler = build_sampler([resolved, {"kind": "temperature", "value": 0.5}])
    assert [repr(s) for s in sampler.steps] == [repr(TopK(TopKParams(k=2))), repr(Temperature(TemperatureParams(value=0.5)))]


def test_the_last_entry_is_the_chooser_even_after_several_processors() -> None:
    sampler = build_sampler([{"kind": "temperature", "value": 0.5}, {"kind": "top_k", "k": 3}, "greedy"])
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    assert sampler.sample(logits, NO_HISTORY).tolist() == [1]


def test_a_custom_chooser_receives_the_generator() -> None:
    seen = []

    class Chooser:
        def __call__(self, logits, input_ids):
            return logits

        def choose(self, logits, generator=None):
            seen.append(generator)
            return logits.argmax(dim=-1)

    generator = torch.Generator().manual_seed(0)
    Sampler([Chooser()]).sample(torch.zeros(1, 3), NO_HISTORY, generator)
    assert seen == [generator]


def test_a_batch_mismatch_names_the_logits_batch() -> None:
    with pytest.raises(ValueError, match=r"input_ids must be \(batch, time\) with batch 2, got shape \(3, 4\)"):
        Sampler([Temperature(TemperatureParams(value=1.0))]).process(torch.zeros(2, 5), torch.zeros(3, 4, dtype=torch.long))


class _Unfilter:
    """A (badly behaved) step that turns -inf back into a finite logit."""

    def __call__(self, logits, input_ids):
        return logits.nan_to_num(neginf=0.0)


class _MakesNaN:
    """A step that rescales -inf (and one finite logit) into NaN."""

    def __call__(self, logits, input_ids):
        out = logits * 0.0  # -inf * 0 = NaN
        out[:, 0] = float("nan")
        return out


def test_a_filtered_token_stays_filtered_whatever_later_steps_do() -> None:
    logits = torch.tensor([[1.0, 5.0, 2.0, 0.5]])
    out = Sampler([TopK(TopKParams(k=2)), _Unfilter()]).process(logits, NO_HISTORY)
    assert kept(out) == {1, 2}


def test_a_nan_made_by_a_step_is_filtered() -> None:
    out = Sampler([TopK(TopKParams(k=3)), _MakesNaN()]).process(torch.tensor([[4.0, 3.0, 2.0, 1.0]]), NO_HISTORY)
    assert kept(out) == {1, 2}


def test_draw_never_picks_nan_and_picks_among_infinite_logits_per_row() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.tensor([
        [float("nan"), -30.0, -30.0, -30.0],     # NaN is never a token: 1, 2 or 3
        [0.0, float("inf"), 0.0, float("inf")],  # certain tokens: 1 or 3, uniformly
        [0.0, 0.0, 0.0, 60.0],                    # another row's +inf must not touch this one: 3
    ]).repeat(200, 1)
    tokens = draw(logits, generator).view(200, 3)
    assert set(tokens[:, 0].tolist()) == {1, 2, 3}
    assert set(tokens[:, 1].tolist()) == {1, 3}
    assert 60 < (tokens[:, 1] == 1).sum() < 140  # uniform between the two: 100 expected, sd 7
    assert set(tokens[:, 2].tolist()) == {3}


def _float32_steps_below(x: torch.Tensor, steps: int) -> torch.Tensor:
    for _ in range(steps):
        x = torch.nextafter(x, torch.tensor(-math.inf))
    return x


@pytest.mark.parametrize("banned", [0, 997], ids=["3 tokens", "997 more banned"])
def test_typical_survives_a_cumulative_mass_that_rounds_below_p(banned: int) -> None:
    # float32 probabilities can add up to less than 1; with p the largest float32 below 1 every
    # mass is then < p, and the crossing index must stay inside the vocabulary (every token kept).
    # Built so that every SIMD kernel meets the case: with ln2 rounded to float32, the logits
    # 0, -2 ln2 and -5 ln2, each two float32 steps lower, have the exps 1, (1 - 2^-22) / 4 and
    # (1 - 2^-21) / 32 exactly. The true exps lie within 0.16 ulp of those, and PyTorch's own
    # polynomial exp reduces by the same float32 ln2, so libm, Sleef and it all return them.
    # Their float32 sum rounds up to 1.28125 in every order of addition, which leaves the
    # probabilities 2^-23 short of 1 in whichever order they are added. Banned tokens (-inf) add 0.
    ln2 = torch.tensor(0x3F317218, dtype=torch.int32).view(torch.float32)
    logits = torch.cat([
        torch.zeros(1), _float32_steps_below(-2 * ln2, 2).view(1), _float32_steps_below(-5 * ln2, 2).view(1),
        torch.full((banned,), -math.inf),
    ]).view(1, -1)
    assert logits[0, :3].exp().tolist() == [1.0, (1 - 2**-22) / 4, (1 - 2**-21) / 32]
    for order in ([0, 1, 2], [2, 1, 0], [1, 2, 0]):  # the sampler sorts; the mass ends short in any order
        ordered = logits[:, order + list(range(3, 3 + banned))]
        assert ordered.softmax(-1).cumsum(-1)[0, -1].item() == 1 - 2**-23  # the case this test is about
    assert kept(Typical(TypicalParams(p=0.99999994))(logits, NO_HISTORY)) == {0, 1, 2}


def test_history_counts_stay_on_the_device_of_the_ids() -> None:
    # The meta device stands in for a second device on a CPU-only machine: a table made on the
    # default device instead would fail to take the ids' scatter.
    from specformer_generate.samplers.history import token_counts, token_seen

    ids = torch.tensor([[1, 2, 2, -1]], device="meta")
    assert token_counts(ids, 5).device.type == "meta"
    assert token_seen(ids, 5).device.type == "meta"
    assert NoRepeatNGram(NoRepeatNGramParams(n=2))(torch.zeros(1, 5, device="meta"), ids).device.type == "meta"


def test_a_long_non_list_sampler_is_quoted_in_sixty_characters() -> None:
    [(path, message)] = problems(10**100)
    quoted = message.removeprefix("expected a list of sampler components, got int ")
    assert path == "generate.sampler" and len(quoted) == 60 and quoted.startswith("1000")
