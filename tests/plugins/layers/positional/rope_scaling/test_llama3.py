"""Llama 3.1 scaling against transformers' ``llama3`` init and the formula of Meta's reference code."""

from __future__ import annotations

import math

import pytest
import torch

import specformer
from specformer_layers.positional.rope_scaling.base import default_inv_freq
from specformer_layers.positional.rope_scaling.llama3 import Llama3Scaling
from specformer_layers.positional.rope_scaling.params import Llama3ScalingParams

from ...support import tiny_spec_over_vocab
from .hf import hf_config, hf_init


@pytest.mark.parametrize(("factor", "low", "high", "original", "head_dim"),
                         [(8.0, 1.0, 4.0, 8192, 128), (32.0, 1.0, 4.0, 8192, 64), (4.0, 2.0, 8.0, 1024, 32)])
def test_matches_transformers(factor: float, low: float, high: float, original: int, head_dim: int) -> None:
    config = hf_config(head_dim=head_dim, theta=500000.0, context_length=original * int(factor), rope_type="llama3",
                       factor=factor, low_freq_factor=low, high_freq_factor=high,
                       original_max_position_embeddings=original)
    inv_freq, attention = hf_init("llama3", config)
    params = Llama3ScalingParams(factor=factor, low_freq_factor=low, high_freq_factor=high,
                                 original_context_length=original)
    ours = Llama3Scaling(params, rotary_dim=head_dim, theta=500000.0)
    torch.testing.assert_close(ours.frequencies(None), inv_freq, rtol=1e-6, atol=0)
    assert ours.attention_scaling == attention == 1.0


def test_formula_per_pair() -> None:
    d, theta, factor, low, high, c = 128, 500000.0, 8.0, 1.0, 4.0, 8192
    params = Llama3ScalingParams(factor=factor, low_freq_factor=low, high_freq_factor=high, original_context_length=c)
    ours = Llama3Scaling(params, rotary_dim=d, theta=theta).frequencies(None)
    base = default_inv_freq(d, theta)
    kinds = set()
    for i, f in enumerate(base.tolist()):
        wavelength = 2 * math.pi / f
        if wavelength < c / high:
            expected, kind = f, "kept"
        elif wavelength > c / low:
            expected, kind = f / factor, "scaled"
        else:
            s = (c / wavelength - low) / (high - low)
            expected, kind = (1 - s) * f / factor + s * f, "blended"
        kinds.add(kind)
        assert math.isclose(ours[i].item(), expected, rel_tol=1e-5), (i, kind)
    assert kinds == {"kept", "scaled", "blended"}


def test_spec_defaults_are_llama_3_1() -> None:
    model = specformer.build(tiny_spec_over_vocab(positional={"kind": "rope", "theta": 500000.0, "scaling": "llama3"}))
    params = Llama3ScalingParams(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_context_length=8192)
    expected = Llama3Scaling(params, rotary_dim=8, theta=500000.0)
    torch.testing.assert_close(model.positional.frequencies(torch.zeros(1, 1, dtype=torch.long)), expected.frequencies(None))


def test_high_must_exceed_low() -> None:
    with pytest.raises(specformer.SpecError, match="high_freq_factor"):
        specformer.load_spec(tiny_spec_over_vocab(positional={"kind": "rope", "scaling": {
            "kind": "llama3", "low_freq_factor": 4.0, "high_freq_factor": 1.0}}))
