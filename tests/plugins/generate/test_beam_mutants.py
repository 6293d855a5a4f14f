"""Beam search ends a beam at a stop sequence, as it does at an eos (found by the mutation run)."""

from __future__ import annotations

import specformer
from specformer_generate import generate

from .specs_for_tests import TINY, assert_not_degenerate

PROMPT = [5, 17, 3, 40]


def ends_at_first_stop(row: list[int], start: int, stop: list[int]) -> bool:
    """Whether ``row`` (generated from ``start`` on) ends right after the first stop sequence it produces."""
    n = len(stop)
    for end in range(max(start, n), len(row) + 1):  # a stop may start in the prompt, but ends on a new token
        if end > start and row[end - n : end] == stop:
            return end == len(row)
    return True  # never produced: nothing to end


def test_beam_search_stops_a_beam_at_a_stop_sequence() -> None:
    model = specformer.build(TINY, seed=0)
    free = generate(model, [PROMPT], max_new_tokens=8, num_beams=2)[0]
    assert_not_degenerate([free[len(PROMPT):]], [PROMPT])
    stop = free[len(PROMPT) + 2 : len(PROMPT) + 4]  # the 3rd and 4th new tokens of the unstopped best beam
    assert not ends_at_first_stop(free, len(PROMPT), stop)  # without the stop, the beam runs on past it
    out = generate(model, [PROMPT], max_new_tokens=8, num_beams=2, stop=[stop])[0]
    assert out[: len(PROMPT)] == PROMPT
    # The winner may be a beam that never produced the stop (a full-length beam can score higher),
    # but no returned beam runs on past one.
    assert ends_at_first_stop(out, len(PROMPT), stop)


def test_beam_settings_are_checked_once_by_generate_with_the_accepted_values() -> None:
    import pytest

    model = specformer.build(TINY)
    with pytest.raises(ValueError, match=r"early_stopping must be True, False or 'never', got str 'sometimes'"):
        generate(model, [[1, 2, 3]], max_new_tokens=2, num_beams=2, early_stopping="sometimes")
