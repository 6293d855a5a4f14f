"""The rglru mixer (Griffin's recurrent block): the recurrence written out, transformers' RecurrentGemmaRecurrentBlock,
and exact through a model with a cache.

Through a whole model: a cached token-by-token decode and a prefill by chunks equal the uncached
forward, a left-padded ragged batch equals each row alone, packed documents equal each document
alone (each one's first token resets the recurrence), beam reordering and speculative rollback
(``keep_steps``) restore states exactly, and the serve engine batches requests as each alone.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError

import specformer
from specformer.model.attention import cache_slots_of, heads_of, reach_of
from specformer.model.state import uses_positions
from specformer_layers.mixers.rglru import RGLRU
from specformer_layers.mixers.rglru_params import RGLRUParams

from tests.fixtures.tiny import tiny_spec
from .through_the_cache import tiny_mixer_model

pytestmark = pytest.mark.usefixtures("one_thread")

MIXER = {"kind": "rglru", "width": 24, "gate_blocks": 3, "conv_kernel": 3, "chunk": 4}


def _randomised(layer: RGLRU) -> RGLRU:
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn_like(p) * 0.4)
    return layer


def _naive(layer: RGLRU, x: torch.Tensor) -> torch.Tensor:
    """Griffin's recurrent block written out token by token for fresh rows (De et al. 2024, eqs. 1-4)."""
    batch, length, _ = x.shape
    width, blocks = layer.width, layer.gate_blocks
    size = width // blocks
    kernel = layer.conv_weight.shape[1]
    xs, y = layer.x_proj(x), F.gelu(layer.y_proj(x), approximate="tanh")
    h = torch.zeros(batch, width)
    outs = []
    for t in range(length):
        u = sum(layer.conv_weight[:, kernel - 1 - j] * (xs[:, t - j] if t >= j else 0.0) for j in range(kernel))
        u = u + (layer.conv_bias if layer.conv_bias is not None else 0.0)
        i_gate = torch.cat([torch.sigmoid(u[:, g * size:(g + 1) * size] @ layer.input_gate_weight[g]
                                          + layer.input_gate_bias[g]) for g in range(blocks)], dim=-1)
        r_gate = torch.cat([torch.sigmoid(u[:, g * size:(g + 1) * size] @ layer.recurrent_gate_weight[g]
                                          + layer.recurrent_gate_bias[g]) for g in range(blocks)], dim=-1)
        a = torch.sigmoid(-layer.a_param) ** (8.0 * r_gate)  # sigmoid(Λ)^(c r), Λ = -a_param, c = 8
        if t == 0:  # the sequence's first token resets the state and is not scaled
            h = i_gate * u
        else:
            h = a * h + torch.sqrt(1 - a * a) * (i_gate * u)
        outs.append(layer.out(h * y[:, t]))
    return torch.stack(outs, dim=1)


@pytest.mark.parametrize(("blocks", "kernel", "bias", "length"), [(1, 4, True, 11), (4, 2, False, 9), (2, 3, True, 1)])
def test_equals_the_recurrence_written_out(blocks: int, kernel: int, bias: bool, length: int) -> None:
    torch.manual_seed(0)
    layer = _randomised(RGLRU(RGLRUParams(width=16, gate_blocks=blocks, conv_kernel=kernel, bias=bias, chunk=4),
                              d_model=8))
    x = torch.randn(2, length, 8)  # lengths not a multiple of the chunk
    with torch.no_grad():
        want = _naive(layer, x)
        torch.testing.assert_close(layer.run(x).out, want, rtol=1e-5, atol=1e-5)
        # Token by token through the state equals the whole sequence at once.
        state, outs = None, []
        for t in range(length):
            done = layer.run(x[:, t:t + 1], state=state)
            outs.append(done.out)
            state = done.state
        torch.testing.assert_close(torch.cat(outs, 1), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("blocks", "width", "kernel"), [(1, 16, 4), (4, 24, 3)])
def test_equals_transformers_recurrent_block(blocks: int, width: int, kernel: int) -> None:
    from transformers import RecurrentGemmaConfig
    from transformers.models.recurrent_gemma.modeling_recurrent_gemma import RecurrentGemmaRecurrentBlock

    config = RecurrentGemmaConfig(hidden_size=width, lru_width=width, num_attention_heads=blocks, conv1d_width=kernel,
                                  num_hidden_layers=1)
    torch.manual_seed(0)
    hf = RecurrentGemmaRecurrentBlock(config, layer_idx=0).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn_like(p) * 0.4)
    ours = RGLRU(RGLRUParams(width=width, gate_blocks=blocks, conv_kernel=kernel, chunk=3), d_model=width)
    with torch.no_grad():
        ours.x_proj.load_state_dict(hf.linear_x.state_dict())
        ours.y_proj.load_state_dict(hf.linear_y.state_dict())
        ours.out.load_state_dict(hf.linear_out.state_dict())
        ours.conv_weight.copy_(hf.conv_1d.weight.squeeze(1))
        ours.conv_bias.copy_(hf.conv_1d.bias)
        for name in ("input_gate_weight", "input_gate_bias", "recurrent_gate_weight", "recurrent_gate_bias"):
            getattr(ours, name).copy_(getattr(hf.rg_lru, name))
        ours.a_param.copy_(hf.rg_lru.recurrent_param)
        x = torch.randn(2, 10, width)
        positions = torch.arange(10).expand(2, 10)
        want, _ = hf(x, positions, None, use_cache=False)
        torch.testing.assert_close(ours.run(x).out, want, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(ours.run(x, steps=True).out, want, rtol=1e-4, atol=1e-5)


# -- through a model ------------------------------------------------------------------------------


def tiny_model(mixed: bool = False, **mixer):
    # gates and decays away from their initial values, biases non-zero
    return tiny_mixer_model({**MIXER, **mixer}, mixed=mixed, perturb=lambda name, p: (
        torch.randn_like(p) * 0.5 if ".mixer." in name and "gate" in name else None))


def test_public_facts() -> None:
    layer = tiny_model().blocks[0].mixer
    assert heads_of(layer) is None  # gate blocks are no heads: nothing per token
    assert not any(hasattr(layer, fact) for fact in ("window", "cache_slots", "uses_positions"))
    assert (reach_of(layer), cache_slots_of(layer), uses_positions(layer)) == (None, None, False)
    assert layer.state_slots.shapes == {"conv": (24, 2), "rglru": (24,), "begun": (1,)}
    assert "chunk 4" in layer.describe_kernel()
    summary = specformer.summarize(tiny_spec(block={"mixer": MIXER}, positional={"kind": "none"}, n_layers=3))
    assert summary.total == sum(p.numel() for p in tiny_model().parameters())


@pytest.mark.parametrize(("change", "message", "where"), [
    ({"conv_kernel": 1}, "conv_kernel must be at least 2", "model.block.mixer.conv_kernel: "),
    ({"width": 0}, "greater than 0", "model.block.mixer.width: "),
    ({"gate_blocks": 5}, r"gate_blocks \(5\) must divide width \(24\)", "model.block.mixer: "),
    ({"activation": "tanh"}, "Input should be", "model.block.mixer.activation: "),
])
def test_bad_params_are_one_clear_line(change: dict, message: str, where: str) -> None:
    with pytest.raises(ValidationError, match=message):
        RGLRUParams(**{**{k: v for k, v in MIXER.items() if k != "kind"}, **change})
    with pytest.raises(Exception, match=message) as caught:
        specformer.build(tiny_spec(block={"mixer": {**MIXER, **change}}), seed=0)

    lines = [line for line in str(caught.value).splitlines() if re.search(message, line)]
    assert len(lines) == 1 and lines[0].strip().startswith(where)
