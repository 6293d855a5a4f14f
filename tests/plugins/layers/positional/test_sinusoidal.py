"""Sinusoidal encodings by the formula of Vaswani et al. 2017."""

from __future__ import annotations

import math

import pytest
import torch

from specformer_layers.positional.sinusoidal import SinusoidalPositions


def test_formula() -> None:
    d = 6
    pe = SinusoidalPositions(d_model=d).embed(torch.tensor([[0, 3, 17]]))
    for t, p in enumerate([0, 3, 17]):
        for i in range(d // 2):
            angle = p / 10000 ** (2 * i / d)
            assert math.isclose(pe[0, t, 2 * i].item(), math.sin(angle), abs_tol=1e-6)
            assert math.isclose(pe[0, t, 2 * i + 1].item(), math.cos(angle), abs_tol=1e-6)


def test_padding_positions_are_clamped() -> None:
    m = SinusoidalPositions(d_model=4)
    assert torch.equal(m.embed(torch.tensor([[-1]])), m.embed(torch.tensor([[0]])))


def test_odd_width_rejected() -> None:
    with pytest.raises(ValueError, match="even d_model, got 5"):
        SinusoidalPositions(d_model=5)
