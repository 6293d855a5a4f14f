"""The lightning mixer (MiniMax-01's Lightning attention): the recurrence written out, the blocked form against it,
transformers' MiniMaxLightningAttention, and exact through a model with a cache.

Through a whole model: a cached token-by-token decode and a prefill by blocks equal the uncached
forward, a left-padded ragged batch equals each row alone, packed documents equal each document
alone, beam reordering and speculative rollback (``keep_steps``) restore states exactly, and the
serve engine batches requests as each alone.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError

import specformer
from specformer.model.attention import cache_slots_of, heads_of, reach_of
from specformer.model.state import uses_positions
from specformer_layers.mixers.lightning import (
    LightningAttention,
    decayed_linear_attention_blocked,
    decayed_linear_attention_recurrent,
)
from specformer_layers.mixers.lightning_params import LightningAttentionParams

from tests.fixtures.tiny import tiny_spec
from .through_the_cache import tiny_mixer_model

pytestmark = pytest.mark.usefixtures("one_thread")

MIXER = {"kind": "lightning", "n_heads": 4, "head_dim": 6, "chunk": 4}


def _layer(*, heads: int = 3, dim: int = 5, d_model: int = 12, chunk: int = 4, layer_index: int = 1,
           n_layers: int = 4) -> LightningAttention:
    layer = LightningAttention(LightningAttentionParams(n_heads=heads, head_dim=dim, chunk=chunk), d_model=d_model,
                               layer_index=layer_index, n_layers=n_layers)
    torch.manual_seed(3)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn_like(p) * 0.4)
    return layer


def _naive(layer: LightningAttention, x: torch.Tensor, *, layer_index: int, n_layers: int) -> torch.Tensor:
    """Lightning attention written out token by token for fresh rows (MiniMax-01, its slope formula spelled out)."""
    batch, length, _ = x.shape
    H, d = layer.n_heads, layer.head_dim
    outs = []
    for b in range(batch):
        rows = []
        states = [torch.zeros(d, d) for _ in range(H)]
        for t in range(length):
            qkv = F.silu(layer.qkv.weight @ x[b, t])  # (3 H d,), per head [q; k; v]
            heads = []
            for h in range(H):
                q, k, v = qkv[h * 3 * d:h * 3 * d + d], qkv[h * 3 * d + d:h * 3 * d + 2 * d], qkv[h * 3 * d + 2 * d:(h + 1) * 3 * d]
                slope = (1 / 2 ** (8 / H)) ** (h + 1) * (1 - layer_index / (n_layers - 1 + 1e-5) + 1e-5)
                states[h] = math.exp(-slope) * states[h] + torch.outer(k, v)
                heads.append(q @ states[h])
            o = torch.cat(heads)
            o = o / torch.sqrt(o.square().mean() + layer.norm.eps) * layer.norm.weight
            rows.append(layer.out.weight @ (o * torch.sigmoid(layer.gate.weight @ x[b, t])))
        outs.append(torch.stack(rows))
    return torch.stack(outs)


@pytest.mark.parametrize(("length", "chunk", "layer_index", "n_layers"), [(11, 4, 1, 4), (8, 4, 0, 1), (1, 3, 3, 4),
                                                                          (13, 5, 2, 3)])
def test_equals_the_recurrence_written_out(length: int, chunk: int, layer_index: int, n_layers: int) -> None:
    layer = _layer(chunk=chunk, layer_index=layer_index, n_layers=n_layers)
    x = torch.randn(2, length, 12)
    with torch.no_grad():
        want = _naive(layer, x, layer_index=layer_index, n_layers=n_layers)
        torch.testing.assert_close(layer.run(x).out, want, rtol=1e-5, atol=1e-5)  # by blocks
        torch.testing.assert_close(layer.run(x, steps=True).out, want, rtol=1e-5, atol=1e-5)  # token by token


@pytest.mark.parametrize(("length", "chunk"), [(10, 4), (7, 7), (9, 16), (12, 1)])
def test_the_blocked_form_equals_the_token_loop_from_any_state_and_with_padding(length: int, chunk: int) -> None:
    torch.manual_seed(length)
    B, H, dk, dv = 3, 2, 4, 5
    q, k = torch.randn(B, H, length, dk), torch.randn(B, H, length, dk)
    v = torch.randn(B, H, length, dv)
    log_decay = -torch.rand(B, H, length) * 2  # per token: padding decays nothing (0)
    log_decay[1, :, :3] = 0.0
    state = torch.randn(B, H, dk, dv)
    loop = decayed_linear_attention_recurrent(q, k, v, log_decay, state=state, steps=True)
    blocks = decayed_linear_attention_blocked(q, k, v, log_decay, state=state, chunk=chunk)
    torch.testing.assert_close(blocks.out, loop.out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(blocks.state, loop.state, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loop.steps[:, -1], loop.state)
    # The loop itself, one step written out: S1 = exp(g0) S0 + k0^T v0, o0 = q0 S1.
    s1 = log_decay[:, :, 0, None, None].exp() * state + k[:, :, 0, :, None] * v[:, :, 0, None, :]
    torch.testing.assert_close(loop.steps[:, 0], s1)
    torch.testing.assert_close(loop.out[:, :, 0], (q[:, :, 0, None, :] @ s1)[:, :, 0])


@pytest.mark.parametrize(("heads", "dim", "layer_index", "n_layers", "block"), [(3, 6, 1, 4, 4), (2, 8, 0, 2, 3)])
def test_equals_transformers_lightning_attention(heads: int, dim: int, layer_index: int, n_layers: int,
                                                 block: int) -> None:
    from transformers import MiniMaxConfig
    from transformers.models.minimax.modeling_minimax import MiniMaxLightningAttention

    d_model = 12
    config = MiniMaxConfig(hidden_size=d_model, num_attention_heads=heads, head_dim=dim, num_hidden_layers=n_layers,
                           block_size=block)
    torch.manual_seed(0)
    hf = MiniMaxLightningAttention(config, layer_idx=layer_index).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn_like(p) * 0.4)
    ours = LightningAttention(LightningAttentionParams(n_heads=heads, head_dim=dim, chunk=4), d_model=d_model,
                              layer_index=layer_index, n_layers=n_layers)
    with torch.no_grad():
        ours.qkv.weight.copy_(hf.qkv_proj.weight)
        ours.gate.weight.copy_(hf.output_gate.weight)
        ours.norm.weight.copy_(hf.norm.weight)
        ours.out.weight.copy_(hf.out_proj.weight)
        x = torch.randn(2, 10, d_model)
        want, _ = hf(x, None, None)
        torch.testing.assert_close(ours.run(x).out, want, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(ours.run(x, steps=True).out, want, rtol=1e-4, atol=1e-5)


# -- through a model ------------------------------------------------------------------------------


def tiny_model(mixed: bool = False, **mixer):
    return tiny_mixer_model({**MIXER, **mixer}, mixed=mixed)


def test_each_layer_decays_by_its_depth() -> None:
    model = tiny_model()
    rates = [block.mixer.decay_rates for block in model.blocks]
    assert rates[0][0] > rates[1][0] > rates[2][0] > 0  # deeper layers forget more slowly
    assert rates[0] == pytest.approx([2 ** (-8 * (h + 1) / 4) * (1 + 1e-5) for h in range(4)])
    assert rates[2] == pytest.approx([2 ** (-8 * (h + 1) / 4) * (1 - 2 / (2 + 1e-5) + 1e-5) for h in range(4)])


def test_public_facts() -> None:
    layer = tiny_model().blocks[0].mixer
    assert heads_of(layer) is not None and layer.n_heads == 4 and layer.head_dim == 6
    assert not any(hasattr(layer, fact) for fact in ("window", "cache_slots", "uses_positions"))
    assert (reach_of(layer), cache_slots_of(layer), uses_positions(layer)) == (None, None, False)
    assert layer.state_slots.shapes == {"recurrent": (4, 6, 6)}
    assert "chunk 4" in layer.describe_kernel()
    summary = specformer.summarize(tiny_spec(block={"mixer": MIXER}, positional={"kind": "none"}, n_layers=3))
    assert summary.total == sum(p.numel() for p in tiny_model().parameters())


@pytest.mark.parametrize(("change", "message", "where"), [
    ({"n_heads": 0}, "greater than 0", "model.block.mixer.n_heads: "),
    ({"chunk": 0}, "greater than 0", "model.block.mixer.chunk: "),
    ({"activation": "tanh"}, "Input should be", "model.block.mixer.activation: "),
])
def test_bad_params_are_one_clear_line(change: dict, message: str, where: str) -> None:
    with pytest.raises(ValidationError, match=message):
        LightningAttentionParams(**{**{k: v for k, v in MIXER.items() if k != "kind"}, **change})
    with pytest.raises(Exception, match=message) as caught:
        specformer.build(tiny_spec(block={"mixer": {**MIXER, **change}}), seed=0)
    lines = [line for line in str(caught.value).splitlines() if re.search(message, line)]
    assert len(lines) == 1 and lines[0].strip().startswith(where)


def test_heads_that_do_not_divide_d_model_need_a_head_dim() -> None:
    with pytest.raises(Exception, match=r"n_heads \(5\) must divide d_model \(32\) unless head_dim is given"):
        specformer.build(tiny_spec(block={"mixer": {"kind": "lightning", "n_heads": 5}}, positional={"kind": "none"}),
                         seed=0)
