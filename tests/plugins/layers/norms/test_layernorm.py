"""LayerNorm by its formula, with and without bias, and non-parametric."""

from __future__ import annotations

import pytest
import torch

from specformer_layers.norms.layernorm import LayerNorm
from specformer_layers.norms.params import LayerNormParams


@pytest.mark.parametrize(("bias", "affine"), [(True, True), (False, True), (True, False), (False, False)])
def test_formula(bias: bool, affine: bool) -> None:
    norm = LayerNorm(LayerNormParams(eps=1e-5, bias=bias, affine=affine), dim=12).double()
    for p in norm.parameters():
        p.data.normal_()
    x = torch.randn(2, 7, 12, dtype=torch.float64) * 4 + 3
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)  # biased variance, as in the paper
    expected = (x - mean) / torch.sqrt(var + 1e-5)
    if affine:
        expected = expected * norm.weight
        if bias:
            expected = expected + norm.bias
    torch.testing.assert_close(norm(x), expected)
    names = {n for n, _ in norm.named_parameters()}
    assert names == ({"weight", "bias"} if affine and bias else {"weight"} if affine else set())


def test_init() -> None:
    norm = LayerNorm(dim=4)
    norm.weight.data.fill_(2.0)
    norm.bias.data.fill_(1.0)
    norm.init_weights(std=0.02, residual_std=0.01)
    assert torch.equal(norm.weight, torch.ones(4)) and torch.equal(norm.bias, torch.zeros(4))


@pytest.mark.parametrize("bias", [True, False])
def test_offset_formula(bias: bool) -> None:
    """``offset: 1`` (Nemotron's LayerNorm1P): the scale is 1 + weight, the weight stored as the scale minus 1."""
    norm = LayerNorm(LayerNormParams(eps=1e-5, bias=bias, offset=1.0), dim=12).double()
    for p in norm.parameters():
        p.data.normal_()
    x = torch.randn(2, 7, 12, dtype=torch.float64) * 4 + 3
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    expected = (x - mean) / torch.sqrt(var + 1e-5) * (1.0 + norm.weight)
    if bias:
        expected = expected + norm.bias
    torch.testing.assert_close(norm(x), expected)


def test_offset_one_starts_as_identity_scale() -> None:
    norm = LayerNorm(LayerNormParams(offset=1.0), dim=8)
    assert torch.equal(norm.weight, torch.zeros(8))
    norm.weight.data.fill_(3.0)
    norm.init_weights(std=0.02, residual_std=0.01)
    assert torch.equal(norm.weight, torch.zeros(8))
    x = torch.randn(3, 8)
    torch.testing.assert_close(norm(x), LayerNorm(dim=8)(x))


def test_an_offset_without_a_weight_is_refused() -> None:
    with pytest.raises(ValueError, match="offset .* needs affine: true"):
        LayerNormParams(affine=False, offset=1.0)
