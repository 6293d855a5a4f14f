"""The two-layer MLP by its formula, with every activation."""

from __future__ import annotations

import pytest
import torch

import specformer
from specformer_layers.ffn.activations import ACTIVATIONS
from specformer_layers.ffn.mlp import MLP
from specformer_layers.ffn.params import MLPParams

from ..support import tiny_spec_over_vocab


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
@pytest.mark.parametrize("bias", [True, False])
def test_formula(activation: str, bias: bool) -> None:
    mlp = MLP(MLPParams(hidden=20, activation=activation, bias=bias), d_model=8).double()
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    h = x @ mlp.fc_in.weight.T + (mlp.fc_in.bias if bias else 0)
    expected = ACTIVATIONS[activation](h) @ mlp.fc_out.weight.T + (mlp.fc_out.bias if bias else 0)
    torch.testing.assert_close(mlp(x), expected)
    assert (mlp.fc_in.bias is None) == (not bias)


def test_relu2_through_a_spec() -> None:
    spec = tiny_spec_over_vocab()
    spec["model"]["block"]["ffn"] = {"kind": "mlp", "activation": "relu2"}
    model = specformer.build(spec, seed=0)
    ffn = model.blocks[0].ffn
    assert ffn.activation is ACTIVATIONS["relu2"] and ffn.fc_in.out_features == 4 * 32


def test_init_scales_the_output_projection() -> None:
    mlp = MLP(MLPParams(hidden=256), d_model=64)
    mlp.init_weights(std=0.02, residual_std=0.002)
    assert abs(mlp.fc_in.weight.std().item() - 0.02) < 0.003
    assert abs(mlp.fc_out.weight.std().item() - 0.002) < 0.0003
    assert torch.equal(mlp.fc_in.bias, torch.zeros(256))
