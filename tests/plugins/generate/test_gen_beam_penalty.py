"""Beam search's length penalty on a hand-built example whose winner depends on the exact formula.

A tiny Markov chain stands in for the model: after the prompt token 0, either A (then
the end token) or B, C (then the end token). The short and the long sequence are the
only ones with non-zero probability, so the winner is whichever scores higher under
``sum(log p) / L ** length_penalty`` with ``L`` the generated tokens, end token included.
The probabilities are chosen so that counting ``L`` one more or one less changes the
winner; the test checks that too, so it cannot pass by accident.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from specformer_generate import generate

START, A, B, C, END = range(5)


class MarkovChain(nn.Module):
    """Next-token logits depend on the last token only: ``log P(next | last)``."""

    context_length = 16
    vocab_size = 5
    d_model = 1

    def __init__(self, p_short: float) -> None:
        super().__init__()
        table = torch.full((5, 5), float("-inf"), dtype=torch.float64)
        table[START, A] = math.log(p_short)
        table[START, B] = math.log(1 - p_short)
        table[A, END] = 0.0
        table[B, C] = 0.0
        table[C, END] = 0.0
        table[END, END] = 0.0
        self.register_buffer("table", table)
        self.unused = nn.Parameter(torch.zeros(1))  # generate() reads the device from a parameter

    def attention_modules(self) -> list[nn.Module]:
        return []  # no KV cache to size: the chain runs without one

    def forward(self, tokens, *, positions=None, last_only=False, cache=None):
        return self.table[tokens]  # (B, T, V)


def score(log_p: float, length: int, length_penalty: float) -> float:
    return log_p / length**length_penalty


def winner(p_short: float, length_penalty: float, shift: int = 0) -> list[int]:
    """The best finished sequence by the formula, with the length counted ``shift`` off."""
    short = score(math.log(p_short), 2 + shift, length_penalty)
    long = score(math.log(1 - p_short), 3 + shift, length_penalty)
    return [START, A, END] if short >= long else [START, B, C, END]


CASES = [(0.56, 1.0), (0.6, 1.0), (0.45, 0.0), (0.7, 2.5), (0.52, 0.5)]


@pytest.mark.parametrize("p_short, length_penalty", CASES)
@pytest.mark.parametrize("early_stopping", [False, True, "never"])
def test_the_winner_is_the_formulas(p_short: float, length_penalty: float, early_stopping) -> None:
    model = MarkovChain(p_short)
    out = generate(model, [[START]], max_new_tokens=6, num_beams=2, length_penalty=length_penalty,
                   eos_token_id=END, early_stopping=early_stopping, use_cache=False)
    assert out == [winner(p_short, length_penalty)]


def test_the_cases_tell_an_off_by_one_apart() -> None:
    """Each miscount of the length (one more, one less) picks another winner in at least one case."""
    for shift in (1, -1):
        assert any(winner(p, lp, shift) != winner(p, lp) for p, lp in CASES), shift
    # and both sequences win somewhere, so a search that always prefers one length fails too
    assert {tuple(winner(p, lp)) for p, lp in CASES} == {(START, A, END), (START, B, C, END)}
