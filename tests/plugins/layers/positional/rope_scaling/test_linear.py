"""Linear scaling (position interpolation) against transformers' ``linear`` init."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from specformer_layers.positional.params import RotaryPositionsParams
from specformer_layers.positional.rope import RotaryPositions
from specformer_layers.positional.rope_scaling.base import default_inv_freq
from specformer_layers.positional.rope_scaling.linear import LinearScaling
from specformer_layers.positional.rope_scaling.params import LinearScalingParams

from .hf import hf_config, hf_init


@pytest.mark.parametrize(("head_dim", "theta", "factor"), [(64, 10000.0, 4.0), (128, 500000.0, 8.0), (32, 1e6, 1.5)])
def test_matches_transformers(head_dim: int, theta: float, factor: float) -> None:
    ours = LinearScaling(LinearScalingParams(factor=factor), rotary_dim=head_dim, theta=theta)
    inv_freq, attention = hf_init("linear", hf_config(head_dim=head_dim, theta=theta, context_length=2048,
                                                       rope_type="linear", factor=factor))
    torch.testing.assert_close(ours.frequencies(None), inv_freq, rtol=0, atol=0)
    assert ours.attention_scaling == attention == 1.0


def test_is_position_interpolation() -> None:
    """Position p with factor f rotates exactly as position p / f does without scaling."""
    plain = RotaryPositions(head_dim=16, context_length=64)
    scaled = RotaryPositions(RotaryPositionsParams(scaling={"kind": "linear", "factor": 4.0}), head_dim=16, context_length=64)
    cos_s, sin_s = scaled.prepare(torch.tensor([[8, 40]]))
    angles = torch.tensor([[2.0, 10.0]])[..., None] * default_inv_freq(16, 10000.0)
    torch.testing.assert_close(cos_s[:, 0, :, :8], angles.cos(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(sin_s[:, 0, :, 8:], angles.sin(), rtol=1e-6, atol=1e-6)
    assert plain.attention_scaling == scaled.attention_scaling == 1.0


def test_bad_factor() -> None:
    with pytest.raises(ValidationError, match="greater than 0"):
        LinearScalingParams(factor=0)
