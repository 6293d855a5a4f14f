"""Sampler components against Hugging Face transformers' logits processors, side by side.

Logits are random with deliberate ties (values rounded to a coarse grid, so many tokens
share a value) and some rows already filtered to -inf, as they are after an earlier step.
"""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from specformer.errors import SpecError
from specformer.registry.discovery import get_registry
from specformer_generate import build_sampler
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
