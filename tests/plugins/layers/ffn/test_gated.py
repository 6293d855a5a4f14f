"""Gated feed-forward networks by formula and against transformers' Llama/Gemma MLPs."""

from __future__ import annotations

import pytest
import torch

import specformer
from specformer_layers.ffn.activations import ACTIVATIONS
from specformer_layers.ffn.gated import GatedMLP
from specformer_layers.ffn.params import GatedMLPParams, default_gated_hidden

from ..support import tiny_spec_over_vocab


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_formula(activation: str) -> None:
    ffn = GatedMLP(GatedMLPParams(hidden=12, activation=activation, bias=True), d_model=8).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    w_gate, w_up = ffn.gate_up.weight.split(12)
    b_gate, b_up = ffn.gate_up.bias.split(12)
    expected = (ACTIVATIONS[activation](x @ w_gate.T + b_gate) * (x @ w_up.T + b_up)) @ ffn.down.weight.T + ffn.down.bias
    torch.testing.assert_close(ffn(x), expected)


@pytest.mark.parametrize(("name", "activation"), [("swiglu", "silu"), ("geglu", "gelu"), ("reglu", "relu")])
def test_registered_defaults(name: str, activation: str) -> None:
    spec = tiny_spec_over_vocab()
    spec["model"]["block"]["ffn"] = {"kind": name}
    ffn = specformer.build(spec).blocks[0].ffn
    assert ffn.activation is ACTIVATIONS[activation]
    assert ffn.hidden == default_gated_hidden(32) == 128  # 8/3 * 32 = 85.3 -> 128 (multiple of 64)
    assert ffn.gate_up.bias is None


def test_matches_transformers_llama_mlp() -> None:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    theirs = LlamaMLP(LlamaConfig(hidden_size=16, intermediate_size=40, hidden_act="silu", num_attention_heads=2, num_key_value_heads=2))
    ours = GatedMLP(GatedMLPParams(hidden=40, activation="silu"), d_model=16)
    ours.gate_up.weight.data.copy_(torch.cat((theirs.gate_proj.weight, theirs.up_proj.weight)))
    ours.down.weight.data.copy_(theirs.down_proj.weight)
    x = torch.randn(3, 16)
    torch.testing.assert_close(ours(x), theirs(x))


def test_matches_transformers_gemma_mlp() -> None:
    from transformers import GemmaConfig
    from transformers.models.gemma.modeling_gemma import GemmaMLP

    theirs = GemmaMLP(GemmaConfig(hidden_size=16, intermediate_size=24, hidden_activation="gelu_pytorch_tanh", num_attention_heads=2, num_key_value_heads=1, head_dim=8))
    ours = GatedMLP(GatedMLPParams(hidden=24, activation="gelu_tanh"), d_model=16)
    ours.gate_up.weight.data.copy_(torch.cat((theirs.gate_proj.weight, theirs.up_proj.weight)))
    ours.down.weight.data.copy_(theirs.down_proj.weight)
    x = torch.randn(3, 16)
    torch.testing.assert_close(ours(x), theirs(x))
