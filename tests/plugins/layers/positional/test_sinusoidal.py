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


def test_fairseq_variant_formula() -> None:
    """XGLM's: position p encoded as p + 2, pair i turning at 10000^(-i/(d/2 - 1)), every sine before every cosine."""
    from specformer_layers.positional.params import SinusoidalPositionsParams

    d = 8
    params = SinusoidalPositionsParams(offset=2, split_halves=True, frequencies="half_minus_one")
    pe = SinusoidalPositions(params, d_model=d).embed(torch.tensor([[0, 3, 17]]))
    for t, p in enumerate([0, 3, 17]):
        for i in range(d // 2):
            angle = (p + 2) / 10000 ** (i / (d // 2 - 1))
            assert math.isclose(pe[0, t, i].item(), math.sin(angle), abs_tol=1e-6)
            assert math.isclose(pe[0, t, d // 2 + i].item(), math.cos(angle), abs_tol=1e-6)


def test_split_halves_alone_keeps_the_papers_frequencies() -> None:
    """CTRL's layout: the paper's frequencies base^(-2i/d), the sines first."""
    from specformer_layers.positional.params import SinusoidalPositionsParams

    d = 6
    pe = SinusoidalPositions(SinusoidalPositionsParams(split_halves=True), d_model=d).embed(torch.tensor([[5]]))
    for i in range(d // 2):
        angle = 5 / 10000 ** (2 * i / d)
        assert math.isclose(pe[0, 0, i].item(), math.sin(angle), abs_tol=1e-6)
        assert math.isclose(pe[0, 0, d // 2 + i].item(), math.cos(angle), abs_tol=1e-6)


def test_half_minus_one_needs_two_pairs() -> None:
    from specformer_layers.positional.params import SinusoidalPositionsParams

    with pytest.raises(ValueError, match="at least 4, got 2"):
        SinusoidalPositions(SinusoidalPositionsParams(frequencies="half_minus_one"), d_model=2)
