"""YaRN against transformers' ``yarn`` init (frequencies and attention factor)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import specformer
from specformer_layers.positional.params import RotaryPositionsParams
from specformer_layers.positional.rope import RotaryPositions
from specformer_layers.positional.rope_scaling.params import YarnScalingParams
from specformer_layers.positional.rope_scaling.yarn import YarnScaling

from ...support import tiny_spec_over_vocab
from .hf import hf_config, hf_cos_sin, hf_init

CASES: list[dict[str, Any]] = [
    {"factor": 4.0, "original_context_length": 4096},
    {"factor": 4.0, "original_context_length": 32768},  # Qwen2.5's suggested long-context setting
    {"factor": 40.0, "original_context_length": 4096, "beta_fast": 32.0, "beta_slow": 1.0,
     "mscale": 1.0, "mscale_all_dim": 1.0},  # DeepSeek-V2 style: the ratio is 1
    {"factor": 16.0, "original_context_length": 2048, "mscale": 0.707, "mscale_all_dim": 1.0},
    {"factor": 8.0, "original_context_length": 1024, "attention_factor": 1.5, "beta_fast": 16.0, "beta_slow": 2.0},
    {"factor": 2.0, "original_context_length": 512, "truncate": False},
    {"factor": 1.0, "original_context_length": 512},
]


@pytest.mark.parametrize(("head_dim", "fraction"), [(128, 1.0), (64, 0.5)])
@pytest.mark.parametrize("case", CASES)
def test_matches_transformers(case: dict[str, Any], head_dim: int, fraction: float) -> None:
    theta = 1e6
    hf_params = {("original_max_position_embeddings" if k == "original_context_length" else k): v for k, v in case.items()}
    config = hf_config(head_dim=head_dim, theta=theta, context_length=case["original_context_length"] * 4,
                       fraction=fraction, rope_type="yarn", **hf_params)
    inv_freq, attention = hf_init("yarn", config)
    ours = YarnScaling(YarnScalingParams(**case), rotary_dim=int(head_dim * fraction), theta=theta,
                       context_length=case["original_context_length"] * 4)
    torch.testing.assert_close(ours.frequencies(None), inv_freq, rtol=1e-6, atol=0)
    assert ours.attention_scaling == pytest.approx(attention, rel=1e-12)


def test_default_factor_is_the_context_ratio() -> None:
    spec = tiny_spec_over_vocab(positional={"kind": "rope", "scaling": {"kind": "yarn", "original_context_length": 8}})
    model = specformer.build(spec)
    assert model.positional.scaling.factor == 4.0  # context_length 32 / 8


def test_cos_sin_match_transformers_rotary() -> None:
    config = hf_config(head_dim=16, theta=10000.0, context_length=64, rope_type="yarn", factor=4.0,
                       original_max_position_embeddings=16)
    scaling = {"kind": "yarn", "original_context_length": 16}  # factor: the context ratio, 64 / 16
    rope = RotaryPositions(RotaryPositionsParams(scaling=scaling), head_dim=16, context_length=64)
    positions = torch.arange(40)[None]
    cos, sin = hf_cos_sin(config, positions)
    ours_cos, ours_sin = rope.prepare(positions)
    torch.testing.assert_close(ours_cos[:, 0], cos, rtol=1e-5, atol=1e-5)  # both laid out per channel
    torch.testing.assert_close(ours_sin[:, 0], torch.cat((-sin[..., :8], sin[..., 8:]), -1), rtol=1e-5, atol=1e-5)  # ours is signed
    assert rope.attention_scaling > 1


def test_betas_checked() -> None:
    with pytest.raises(specformer.SpecError, match="beta_fast"):
        specformer.load_spec(tiny_spec_over_vocab(positional={"kind": "rope", "scaling": {
            "kind": "yarn", "original_context_length": 8, "beta_fast": 1.0, "beta_slow": 2.0}}))
