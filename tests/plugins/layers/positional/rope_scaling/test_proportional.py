"""Proportional RoPE (Gemma 4's global layers) against transformers' ``proportional`` init and its formula."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from specformer_layers.positional.params import RotaryPositionsParams
from specformer_layers.positional.rope import RotaryPositions
from specformer_layers.positional.rope_scaling.params import ProportionalScalingParams
from specformer_layers.positional.rope_scaling.proportional import ProportionalScaling

from .hf import hf_config, hf_init


@pytest.mark.parametrize(("head_dim", "fraction", "factor"), [(64, 0.25, 1.0), (48, 0.5, 2.0), (40, 0.3, 1.0)])
def test_matches_transformers(head_dim: int, fraction: float, factor: float) -> None:
    ours = ProportionalScaling(ProportionalScalingParams(fraction=fraction, factor=factor), rotary_dim=head_dim,
                               theta=1e6)
    inv_freq, attention = hf_init("proportional", hf_config(head_dim=head_dim, theta=1e6, context_length=2048,
                                                             rope_type="proportional", fraction=fraction, factor=factor))
    torch.testing.assert_close(ours.frequencies(None), inv_freq, rtol=0, atol=0)
    assert ours.attention_scaling == attention == 1.0


def test_the_first_pairs_turn_at_the_whole_heads_spacing_and_the_rest_stay() -> None:
    """Pair i of 8 (head 16, fraction 0.25: pairs 0 and 1 turn) at position p: angle p * theta^(-2i/16), else 0."""
    rope = RotaryPositions(RotaryPositionsParams(theta=100.0, scaling={"kind": "proportional", "fraction": 0.25}),
                           head_dim=16, context_length=64)
    cos, sin = rope.prepare(torch.tensor([[5]]))
    angles = torch.tensor([5.0 * 100.0 ** (-2 * i / 16) if i < 2 else 0.0 for i in range(8)])
    torch.testing.assert_close(cos[0, 0, 0, :8], angles.cos(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(sin[0, 0, 0, 8:], angles.sin(), rtol=1e-6, atol=1e-6)


def test_bad_fraction() -> None:
    with pytest.raises(ValidationError, match="less than or equal to 1"):
        ProportionalScalingParams(fraction=1.5)
