"""Dynamic NTK scaling against transformers' ``dynamic`` init and its length-dependent rotary module."""

from __future__ import annotations

import pytest
import torch

import specformer
from specformer_layers.positional.params import RotaryPositionsParams
from specformer_layers.positional.rope import RotaryPositions
from specformer_layers.positional.rope_scaling.base import default_inv_freq
from specformer_layers.positional.rope_scaling.dynamic import DynamicNTKScaling
from specformer_layers.positional.rope_scaling.params import DynamicNTKScalingParams

from ...support import ListCache, tiny_spec_over_vocab
from .hf import hf_config, hf_cos_sin, hf_init


@pytest.mark.parametrize(("head_dim", "fraction"), [(64, 1.0), (32, 0.5)])
@pytest.mark.parametrize("seq_len", [100, 256, 257, 1000, 5000])
def test_frequencies_match_transformers(head_dim: int, fraction: float, seq_len: int) -> None:
    rotary_dim = int(head_dim * fraction)
    ours = DynamicNTKScaling(DynamicNTKScalingParams(factor=3.0), rotary_dim=rotary_dim, theta=10000.0,
                             context_length=256)  # original_context_length: the model's
    config = hf_config(head_dim=head_dim, theta=10000.0, context_length=256, fraction=fraction,
                       rope_type="dynamic", factor=3.0)
    inv_freq, attention = hf_init("dynamic", config, seq_len=seq_len)
    torch.testing.assert_close(ours.frequencies(torch.tensor(seq_len)), inv_freq, rtol=1e-6, atol=0)
    assert ours.attention_scaling == attention == 1.0


def test_formula() -> None:
    d, theta, factor, c, length = 16, 10000.0, 2.0, 64, 200
    ours = DynamicNTKScaling(DynamicNTKScalingParams(factor=factor, original_context_length=c), rotary_dim=d, theta=theta,
                             context_length=4 * c)
    new_theta = theta * (factor * length / c - (factor - 1)) ** (d / (d - 2))
    torch.testing.assert_close(ours.frequencies(torch.tensor(length)), default_inv_freq(d, new_theta), rtol=1e-5, atol=0)
    # At or below the original context: RoPE's own frequencies.
    torch.testing.assert_close(ours.frequencies(torch.tensor(c)), default_inv_freq(d, theta))
    torch.testing.assert_close(ours.frequencies(torch.tensor(3)), default_inv_freq(d, theta))


@pytest.mark.parametrize("length", [20, 48])
def test_forward_of_length_t_matches_transformers_rotary(length: int) -> None:
    """A fresh length-T forward: transformers updates its frequencies to max(position) + 1 = T; so do we."""
    config = hf_config(head_dim=16, theta=10000.0, context_length=16, rope_type="dynamic", factor=4.0)
    rope = RotaryPositions(RotaryPositionsParams(scaling={"kind": "dynamic", "factor": 4.0}), head_dim=16, context_length=16)
    positions = torch.arange(length).expand(2, length)
    cos, sin = hf_cos_sin(config, positions)  # (B, T, 16): halves repeated
    ours_cos, ours_sin = rope.prepare(positions)
    torch.testing.assert_close(ours_cos[:, 0], cos, rtol=1e-5, atol=1e-5)  # both laid out per channel
    torch.testing.assert_close(ours_sin[:, 0], torch.cat((-sin[..., :8], sin[..., 8:]), -1), rtol=1e-5, atol=1e-5)  # ours is signed


def test_uses_the_longest_position_of_the_batch() -> None:
    scaling = {"kind": "dynamic", "factor": 2.0, "original_context_length": 4}
    rope = RotaryPositions(RotaryPositionsParams(scaling=scaling), head_dim=8, context_length=4)
    positions = torch.tensor([[0, 1, 2, -1], [6, 7, 8, 9]])
    torch.testing.assert_close(rope.frequencies(positions), rope.scaling.frequencies(torch.tensor(10)))


def test_default_original_context_is_the_models() -> None:
    spec = tiny_spec_over_vocab(positional={"kind": "rope", "scaling": {"kind": "dynamic", "factor": 2.0}})
    model = specformer.build(spec)
    assert model.positional.scaling.original_context_length == 32


def test_under_a_cache_keys_keep_the_rotation_they_were_written_with() -> None:
    """The documented caveat: step-by-step decoding past the original context differs from one forward."""
    spec = tiny_spec_over_vocab(positional={"kind": "rope",
                                            "scaling": {"kind": "dynamic", "factor": 4.0, "original_context_length": 8}})
    model = specformer.build(spec, seed=0, dtype=torch.float64).eval()
    x = torch.randint(0, 61, (1, 16))
    full = model(x)
    cache = ListCache()
    steps = [model(x[:, :8], positions=torch.arange(8)[None], cache=cache)]
    for t in range(8, 16):
        steps.append(model(x[:, t:t + 1], positions=torch.tensor([[t]]), cache=cache))
    stepped = torch.cat(steps, dim=1)
    # The prefill (8 tokens) is a forward of length 8: RoPE's own frequencies...
    torch.testing.assert_close(stepped[:, :8], model(x[:, :8]))
    # ...while a single forward of 16 tokens rotates every token with the length-16 frequencies.
    assert not torch.allclose(full[:, :8], stepped[:, :8], atol=1e-6)
    assert not torch.allclose(stepped[:, 8:], full[:, 8:], atol=1e-6)
    # Each decoding step's query is rotated for its own length (t + 1), as in transformers.
    last = model(x, positions=torch.arange(16)[None])
    torch.testing.assert_close(last, full)


def test_needs_more_than_two_rotary_channels() -> None:
    with pytest.raises(ValueError, match="rotary_dim > 2"):
        DynamicNTKScaling(DynamicNTKScalingParams(factor=2.0), rotary_dim=2, theta=10000.0, context_length=8)
