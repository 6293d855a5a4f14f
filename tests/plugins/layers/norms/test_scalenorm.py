"""ScaleNorm by the formula of Nguyen & Salazar 2019."""

from __future__ import annotations

import math

import torch

from specformer_layers.norms.params import ScaleNormParams
from specformer_layers.norms.scalenorm import ScaleNorm


def test_formula_and_init() -> None:
    norm = ScaleNorm(ScaleNormParams(eps=1e-5), dim=16).double()
    assert norm.scale.item() == math.sqrt(16)
    norm.scale.data.fill_(2.5)
    x = torch.randn(3, 16, dtype=torch.float64)
    expected = 2.5 * x / torch.sqrt((x ** 2).sum(-1, keepdim=True))
    torch.testing.assert_close(norm(x), expected)
    norm.init_weights(std=0.02, residual_std=0.01)
    assert norm.scale.item() == 4.0


def test_unit_rms_at_init_and_zero_input() -> None:
    norm = ScaleNorm(dim=64)
    y = norm(torch.randn(5, 64) * 10)
    torch.testing.assert_close(y.pow(2).mean(-1), torch.ones(5))
    assert torch.equal(norm(torch.zeros(2, 64)), torch.zeros(2, 64))  # eps bounds the divisor


def test_bfloat16_computed_in_float32() -> None:
    norm = ScaleNorm(dim=32)
    x = torch.randn(4, 32)
    low = norm.bfloat16()(x.bfloat16())
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float(), ScaleNorm(dim=32)(x.bfloat16().float()), rtol=1e-2, atol=1e-2)
