"""clip_qkv: queries, keys and values clamped to [-c, c] right after their projection (OLMo, DBRX)."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from specformer_layers.attention.params import CausalSelfAttentionParams
from specformer_layers.positional.rope import RotaryPositions

from ..support import causal_positions, context
from .test_causal import D, make


def reference(attention, x: torch.Tensor, positions: torch.Tensor, rope: RotaryPositions, clip: float) -> torch.Tensor:
    """The formula: clamp(x W_qkv + b) split into heads, rope on q and k, causal softmax per head, output projection."""
    B, T, _ = x.shape
    H, KV, hd = attention.n_heads, attention.n_kv_heads, attention.head_dim
    qkv = (x @ attention.qkv.weight.T + attention.qkv.bias).clamp(-clip, clip)
    q, k, v = qkv.split((H * hd, KV * hd, KV * hd), dim=-1)
    q = q.view(B, T, H, hd).transpose(1, 2)
    k = k.view(B, T, KV, hd).transpose(1, 2).repeat_interleave(H // KV, dim=1)  # each query head's kv head
    v = v.view(B, T, KV, hd).transpose(1, 2).repeat_interleave(H // KV, dim=1)
    state = rope.prepare(positions)
    q, k = rope.rotate(q, state), rope.rotate(k, state)
    scores = q @ k.transpose(-1, -2) * hd ** -0.5
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    y = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, H * hd)
    return y @ attention.out.weight.T + attention.out.bias


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_clip_formula(backend: str) -> None:
    clip = 0.4
    attention = make(n_kv_heads=2, qkv_bias=True, out_bias=True, clip_qkv=clip, backend=backend)
    rope = RotaryPositions(head_dim=6, context_length=16)
    x = torch.randn(2, 7, D, dtype=torch.float64)
    positions = causal_positions(2, 7)
    projected = x @ attention.qkv.weight.T + attention.qkv.bias
    assert (projected.abs() > clip).float().mean() > 0.3  # the clamp bites on many channels
    got = attention(x, context(positions, rope, plain_causal=True))
    torch.testing.assert_close(got, reference(attention, x, positions, rope, clip))
    # Unclipped, the same weights give other outputs: the clamp is applied, not only declared.
    attention.clip_qkv = None
    assert not torch.allclose(attention(x, context(positions, rope, plain_causal=True)), got)


def test_clip_adds_no_parameters_and_shows_in_the_repr() -> None:
    plain = CausalSelfAttentionParams(n_heads=4, n_kv_heads=2).sized(d_model=D)
    clipped = CausalSelfAttentionParams(n_heads=4, n_kv_heads=2, clip_qkv=8.0).sized(d_model=D)
    assert clipped.parameters == plain.parameters
    assert "clip_qkv=8.0" in make(clip_qkv=8.0).extra_repr()
    assert "clip_qkv" not in make().extra_repr()


@pytest.mark.parametrize("bad", [0.0, -1.0])
def test_a_clip_that_is_not_positive_is_refused(bad: float) -> None:
    with pytest.raises(ValidationError, match="clip_qkv"):
        CausalSelfAttentionParams(n_heads=4, clip_qkv=bad)
