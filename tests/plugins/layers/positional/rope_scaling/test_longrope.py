"""LongRoPE against transformers' ``longrope`` init and its short/long switch in the rotary module."""

from __future__ import annotations

import math

import pytest
import torch

import specformer
from specformer_layers.positional.params import RotaryPositionsParams
from specformer_layers.positional.rope import RotaryPositions
from specformer_layers.positional.rope_scaling.longrope import LongRopeScaling
from specformer_layers.positional.rope_scaling.params import LongRopeScalingParams

from ...support import tiny_spec_over_vocab
from .hf import hf_config, hf_cos_sin, hf_init

SHORT = [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8]
LONG = [1.2, 2.0, 3.5, 5.0, 8.0, 12.0, 20.0, 30.0]


@pytest.mark.parametrize("seq_len", [None, 100, 4096, 4097, 20000])
@pytest.mark.parametrize("attention_factor", [None, 1.2])
def test_matches_transformers(seq_len: int | None, attention_factor: float | None) -> None:
    extra = {} if attention_factor is None else {"attention_factor": attention_factor}
    config = hf_config(head_dim=32, theta=10000.0, context_length=131072, fraction=0.5, rope_type="longrope",
                       short_factor=SHORT, long_factor=LONG, original_max_position_embeddings=4096, **extra)
    inv_freq, attention = hf_init("longrope", config, seq_len=seq_len)
    params = LongRopeScalingParams(short_factor=SHORT, long_factor=LONG, original_context_length=4096,
                                   attention_factor=attention_factor)
    ours = LongRopeScaling(params, rotary_dim=16, theta=10000.0, context_length=131072)  # factor: the context ratio
    got = ours.frequencies(None if seq_len is None else torch.tensor(seq_len))
    torch.testing.assert_close(got, inv_freq, rtol=1e-6, atol=0)
    assert ours.attention_scaling == pytest.approx(attention, rel=1e-12)


def test_default_attention_factor() -> None:
    params = LongRopeScalingParams(short_factor=SHORT, long_factor=LONG, original_context_length=4096, factor=32.0)
    ours = LongRopeScaling(params, rotary_dim=16, theta=10000.0, context_length=4096)
    assert ours.attention_scaling == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))


@pytest.mark.parametrize("length", [10, 30])
def test_rotary_switches_like_transformers(length: int) -> None:
    config = hf_config(head_dim=16, theta=10000.0, context_length=64, rope_type="longrope",
                       short_factor=SHORT, long_factor=LONG, original_max_position_embeddings=16)
    scaling = {"kind": "longrope", "short_factor": SHORT, "long_factor": LONG, "original_context_length": 16}
    rope = RotaryPositions(RotaryPositionsParams(scaling=scaling), head_dim=16, context_length=64)
    positions = torch.arange(length)[None]
    cos, sin = hf_cos_sin(config, positions)
    ours_cos, ours_sin = rope.prepare(positions)
    torch.testing.assert_close(ours_cos[:, 0], cos, rtol=1e-5, atol=1e-5)  # both laid out per channel
    torch.testing.assert_close(ours_sin[:, 0], torch.cat((-sin[..., :8], sin[..., 8:]), -1), rtol=1e-5, atol=1e-5)  # ours is signed


def test_factor_count_checked() -> None:
    with pytest.raises(specformer.SpecError, match="short_factor has 3 values; it needs one per rotary channel pair: 4"):
        specformer.load_spec(tiny_spec_over_vocab(positional={"kind": "rope", "scaling": {
            "kind": "longrope", "short_factor": [1.0] * 3, "long_factor": [1.0] * 4, "original_context_length": 8}}))
