"""The mamba2 mixer: equal to transformers' Mamba2Mixer, and exact through a model with a cache.

Through a whole model: a cached token-by-token decode equals the uncached forward, a
left-padded ragged batch equals each row alone, packed documents equal each document alone,
beam reordering and speculative rollback (``keep_steps``) restore states exactly, and the serve
engine batches requests as each alone.
"""

from __future__ import annotations

import re

import pytest
import torch
from pydantic import ValidationError

import specformer
from specformer.model.attention import cache_slots_of, reach_of
from specformer.model.state import uses_positions
from specformer_layers.mixers.mamba2 import Mamba2
from specformer_layers.mixers.mamba2_params import Mamba2Params

from tests.fixtures.tiny import tiny_spec
from .through_the_cache import tiny_mixer_model

pytestmark = pytest.mark.usefixtures("one_thread")

MIXER = {"kind": "mamba2", "n_heads": 4, "head_dim": 8, "state_size": 6, "n_groups": 2, "conv_kernel": 3, "chunk": 4}


# -- the module against transformers --------------------------------------------------------------


def _hf_mixer(*, heads: int, head_dim: int, size: int, groups: int, kernel: int, conv_bias: bool, bias: bool):
    from transformers import Mamba2Config
    from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer

    config = Mamba2Config(hidden_size=16, num_heads=heads, head_dim=head_dim, expand=heads * head_dim // 16,
                          state_size=size, n_groups=groups, conv_kernel=kernel, use_conv_bias=conv_bias,
                          use_bias=bias, chunk_size=3, num_hidden_layers=1, layer_norm_epsilon=1e-5)
    torch.manual_seed(0)
    mixer = Mamba2Mixer(config, layer_idx=0).eval()
    with torch.no_grad():
        for p in mixer.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
        mixer.A_log.copy_(torch.rand(heads).log())
    return mixer


@pytest.mark.parametrize(("groups", "kernel", "bias"), [(1, 4, False), (2, 3, True), (4, 4, True)])
def test_equals_transformers_mamba2_mixer(groups: int, kernel: int, bias: bool) -> None:
    hf = _hf_mixer(heads=4, head_dim=8, size=5, groups=groups, kernel=kernel, conv_bias=bias, bias=bias)
    ours = Mamba2(Mamba2Params(n_heads=4, head_dim=8, state_size=5, n_groups=groups, conv_kernel=kernel,
                               conv_bias=bias, bias=bias, chunk=3), d_model=16)
    with torch.no_grad():
        ours.in_proj.load_state_dict(hf.in_proj.state_dict())
        ours.out.load_state_dict(hf.out_proj.state_dict())
        ours.conv_weight.copy_(hf.conv1d.weight.squeeze(1))
        if bias:
            ours.conv_bias.copy_(hf.conv1d.bias)
        for name in ("dt_bias", "A_log", "D"):
            getattr(ours, name).copy_(getattr(hf, name))
        ours.norm.weight.copy_(hf.norm.weight)
    x = torch.randn(2, 8, 16)
    want = hf(x)
    got = ours.run(x).out
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


# -- through a model ------------------------------------------------------------------------------


def tiny_model(mixed: bool = False, **mixer):
    return tiny_mixer_model({**MIXER, **mixer}, mixed=mixed)


def test_public_facts() -> None:
    layer = tiny_model().blocks[0].mixer
    assert (layer.n_heads, layer.head_dim) == (4, 8) and not hasattr(layer, "n_kv_heads")
    assert not hasattr(layer, "window") and not hasattr(layer, "cache_slots")
    assert (reach_of(layer), cache_slots_of(layer), uses_positions(layer)) == (None, None, False)
    assert layer.state_slots.shapes == {"conv": (32 + 2 * 2 * 6, 2), "ssm": (4, 8, 6)}
    assert "chunk 4" in layer.describe_kernel()


@pytest.mark.parametrize(("change", "message", "where"), [
    ({"conv_kernel": 1}, "conv_kernel must be at least 2", "model.block.mixer.conv_kernel: "),
    ({"conv_kernel": 0}, "conv_kernel must be at least 2", "model.block.mixer.conv_kernel: "),
    ({"n_groups": 3}, r"n_groups \(3\) must divide n_heads \(4\)", "model.block.mixer: "),
    ({"dt_min": 0.5, "dt_max": 0.1}, r"dt_max \(0.1\) must be above dt_min \(0.5\)", "model.block.mixer: "),
])
def test_bad_params_are_one_clear_line(change: dict, message: str, where: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Mamba2Params(**{**{k: v for k, v in MIXER.items() if k != "kind"}, **change})
    with pytest.raises(Exception, match=message) as caught:
        specformer.build(tiny_spec(block={"mixer": {**MIXER, **change}}), seed=0)

    lines = [line for line in str(caught.value).splitlines() if re.search(message, line)]
    assert len(lines) == 1 and lines[0].strip().startswith(where)
