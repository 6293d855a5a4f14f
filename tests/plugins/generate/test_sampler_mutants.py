"""Sampler behaviour the mutation run (benchmarks/mutation.py) found unpinned.

Each test names the planted bug it catches. The references are written out here: which
tokens survive a filter is worked out by hand for a small, exactly representable
distribution, not taken from the implementation.
"""

from __future__ import annotations

import math

import pytest
import torch

from pydantic import ValidationError

from specformer_generate.samplers.greedy import Greedy
from specformer_generate.samplers.min_p import MinP
from specformer_generate.samplers.no_repeat_ngram import NoRepeatNGram
from specformer_generate.samplers.params import (FrequencyPenaltyParams, MinPParams, NoRepeatNGramParams,
                                                 PresencePenaltyParams, RepetitionPenaltyParams, TemperatureParams,
                                                 TopKParams, TopPParams, TypicalParams)
from specformer_generate.samplers.penalties import FrequencyPenalty, PresencePenalty
from specformer_generate.samplers.repetition import RepetitionPenalty
from specformer_generate.samplers.temperature import Temperature
from specformer_generate.samplers.top_k import TopK
from specformer_generate.samplers.top_p import TopP
from specformer_generate.samplers.typical import Typical

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
