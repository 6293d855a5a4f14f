"""Sampler behaviour the mutation run (benchmarks/mutation.py) found unpinned.

Each test names the planted bug it catches. The references are written out here: which
tokens survive a filter is worked out by hand for a small, exactly representable
distribution, not taken from the implementation.
"""

from __future__ import annotations

import math

import pytest
import torch

from specformer_generate.samplers import (
    FrequencyPenalty,
    Greedy,
    MinP,
    NoRepeatNGram,
    PresencePenalty,
    RepetitionPenalty,
    Temperature,
    TopK,
    TopP,
    Typical,
)

NO_HISTORY = torch.zeros(1, 0, dtype=torch.long)


def kept(logits: torch.Tensor) -> set[int]:
    """The token ids a filter left possible in the single row of ``logits``."""
    return {int(i) for i in torch.nonzero(torch.isfinite(logits[0])).flatten()}


def log_probs(*probs: float) -> torch.Tensor:
    """One row of logits whose softmax is ``probs`` (float64, so sums of powers of two stay exact)."""
    return torch.tensor([[math.log(p) for p in probs]], dtype=torch.float64)


# -- defaults and from_params: min_tokens_to_keep is 1 unless the spec says otherwise -----------


def test_default_min_tokens_to_keep_is_one_for_every_filter() -> None:
    # A clear winner: each filter set tight keeps exactly it (a default of 2 would keep two).
    logits = log_probs(0.7, 0.2, 0.1)
    assert kept(TopK(k=1)(logits, NO_HISTORY)) == {0}
    assert kept(TopP(p=0.01)(logits, NO_HISTORY)) == {0}
    assert kept(MinP(p=1.0)(logits, NO_HISTORY)) == {0}
    # Typical: the token nearest the entropy comes first; p tiny keeps only it.
    assert len(kept(Typical(p=0.01)(logits, NO_HISTORY))) == 1


@pytest.mark.parametrize("cls, params", [
    (TopK, {"k": 1}),
    (TopP, {"p": 0.01}),
    (MinP, {"p": 1.0}),
    (Typical, {"p": 0.01}),
])
def test_from_params_passes_min_tokens_to_keep_on(cls: type, params: dict) -> None:
    sampler = cls.from_params(cls.Params(**params, min_tokens_to_keep=3))
    assert len(kept(sampler(log_probs(0.6, 0.2, 0.1, 0.06, 0.04), NO_HISTORY))) == 3


# -- bounds: the constructor refuses exactly what its Params refuse, with a message -----------


@pytest.mark.parametrize("make, message", [
    (lambda: Temperature(value=True), "temperature must be a finite number > 0, got True"),
    (lambda: TopP(p=0.0), "top_p needs 0 < p <= 1, got 0.0"),
    (lambda: MinP(p=1.5), "min_p needs 0 <= p <= 1, got 1.5"),
    (lambda: Typical(p=0.0), "typical needs 0 < p < 1, got 0.0"),
    (lambda: Typical(p=1.0), "typical needs 0 < p < 1, got 1.0"),
    (lambda: Typical(p=1.5), "typical needs 0 < p < 1, got 1.5"),
    (lambda: RepetitionPenalty(penalty=0.0), "repetition_penalty must be > 0, got 0.0"),
    (lambda: FrequencyPenalty(penalty=-2.5), "frequency_penalty must be in [-2, 2], got -2.5"),
    (lambda: FrequencyPenalty(penalty=2.5), "frequency_penalty must be in [-2, 2], got 2.5"),
    (lambda: PresencePenalty(penalty=-2.5), "presence_penalty must be in [-2, 2], got -2.5"),
    (lambda: PresencePenalty(penalty=2.5), "presence_penalty must be in [-2, 2], got 2.5"),
    (lambda: NoRepeatNGram(n=0), "no_repeat_ngram needs n >= 1, got 0"),
    (lambda: TopK(k=2, min_tokens_to_keep=0), "min_tokens_to_keep must be >= 1, got 0"),
    (lambda: TopP(p=0.5, min_tokens_to_keep=0), "min_tokens_to_keep must be >= 1, got 0"),
    (lambda: MinP(p=0.5, min_tokens_to_keep=0), "min_tokens_to_keep must be >= 1, got 0"),
    (lambda: Typical(p=0.5, min_tokens_to_keep=0), "min_tokens_to_keep must be >= 1, got 0"),
])
def test_out_of_range_settings_are_refused_with_the_range(make, message: str) -> None:
    with pytest.raises(ValueError) as info:
        make()
    assert str(info.value).startswith(message)


@pytest.mark.parametrize("cls", [FrequencyPenalty, PresencePenalty])
def test_penalties_accept_both_ends_of_their_range(cls: type) -> None:
    for penalty in (-2.0, 2.0):
        assert cls(penalty=penalty).penalty == penalty


# -- typical sampling at its boundaries ------------------------------------------------------------


def test_typical_stops_at_the_first_token_whose_cumulative_mass_reaches_p() -> None:
    # probs (1/2, 1/4, 1/8, 1/8): -log p = (ln 2, 2 ln 2, 3 ln 2, 3 ln 2), entropy 1.75 ln 2, so the
    # order by |-log p - H| is token 1 (0.25 ln 2), token 0 (0.75 ln 2), then 2 and 3 (1.25 ln 2).
    # Cumulative mass in that order: 1/4, 3/4, 7/8, 1. With p = 3/4 the mass reaches p at token 0:
    # tokens 1 and 0 are kept (transformers' TypicalLogitsWarper counts masses strictly below p).
    logits = log_probs(0.5, 0.25, 0.125, 0.125)
    assert kept(Typical(p=0.75)(logits, NO_HISTORY)) == {0, 1}


def test_typical_keeps_every_token_when_only_the_last_reaches_p() -> None:
    # probs (0.5, 0.25, 0.15, 0.1): entropy 1.208 nats, so |-log p - H| = (0.515, 0.178, 0.689, 1.095):
    # order 1, 0, 2, 3 with cumulative mass 0.25, 0.75, 0.9, 1. p = 0.95 is reached only by the last.
    logits = log_probs(0.5, 0.25, 0.15, 0.1)
    assert kept(Typical(p=0.95)(logits, NO_HISTORY)) == {0, 1, 2, 3}


# -- penalties keep the logits' dtype ---------------------------------------------------------------


@pytest.mark.parametrize("step", [FrequencyPenalty(penalty=0.5), PresencePenalty(penalty=0.5)])
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
    out = NoRepeatNGram(n=3)(torch.zeros(1, 8), torch.tensor([[5, 5, 5]]))
    assert kept(out) == set(range(8)) - {5}


def test_greedy_names_itself() -> None:
    assert repr(Greedy()) == "greedy"
