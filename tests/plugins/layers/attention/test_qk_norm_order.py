"""qk_norm_order after_rope: queries and keys rotated first, then normalised per head (Hunyuan-V1)."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from specformer_layers.attention.params import CausalSelfAttentionParams
from specformer_layers.positional.rope import RotaryPositions

from ..support import ListCache, causal_positions, context
from .test_causal import D, make

EPS = 1e-6


def rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """RMSNorm over the last axis, written out: x / sqrt(mean(x^2) + eps) * w."""
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * weight


def reference(attention, x: torch.Tensor, positions: torch.Tensor, rope: RotaryPositions) -> torch.Tensor:
    """x W_qkv split into heads, rope on q and k, then RMSNorm of each rotated head, causal softmax, output."""
    B, T, _ = x.shape
    H, KV, hd = attention.n_heads, attention.n_kv_heads, attention.head_dim
    q, k, v = (x @ attention.qkv.weight.T).split((H * hd, KV * hd, KV * hd), dim=-1)
    q = q.view(B, T, H, hd).transpose(1, 2)
    k = k.view(B, T, KV, hd).transpose(1, 2)
    v = v.view(B, T, KV, hd).transpose(1, 2)
    state = rope.prepare(positions)
    q, k = rope.rotate(q, state), rope.rotate(k, state)
    q, k = rms(q, attention.q_norm.weight), rms(k, attention.k_norm.weight)
    k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)  # each query head's kv head
    scores = q @ k.transpose(-1, -2) * hd ** -0.5
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    y = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, H * hd)
    return y @ attention.out.weight.T


def after_rope(backend: str = "eager"):
    return make(n_kv_heads=2, qk_norm={"kind": "rmsnorm", "eps": EPS}, qk_norm_order="after_rope", backend=backend)


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_after_rope_formula(backend: str) -> None:
    attention = after_rope(backend)
    rope = RotaryPositions(head_dim=6, context_length=16)
    x = torch.randn(2, 7, D, dtype=torch.float64)
    positions = causal_positions(2, 7)
    got = attention(x, context(positions, rope, plain_causal=True))
    torch.testing.assert_close(got, reference(attention, x, positions, rope))
    # The same weights normalised before rotation give other outputs: the order is applied, not only declared.
    attention.qk_norm_after_rope = False
    assert not torch.allclose(attention(x, context(positions, rope, plain_causal=True)), got)


def test_after_rope_through_the_cache() -> None:
    attention = after_rope()
    rope = RotaryPositions(head_dim=6, context_length=16)
    x = torch.randn(2, 9, D, dtype=torch.float64)
    cache = ListCache()
    steps = [attention(x[:, :5], context(causal_positions(2, 5), rope, cache=cache))]
    steps += [attention(x[:, t:t + 1], context(torch.full((2, 1), t), rope, cache=cache)) for t in range(5, 9)]
    whole = attention(x, context(causal_positions(2, 9), rope, plain_causal=True))
    torch.testing.assert_close(torch.cat(steps, 1), whole)


def test_order_adds_no_parameters_and_shows_in_the_repr() -> None:
    base = {"n_heads": 4, "n_kv_heads": 2, "qk_norm": "rmsnorm"}
    before = CausalSelfAttentionParams(**base).sized(d_model=D)
    after = CausalSelfAttentionParams(**base, qk_norm_order="after_rope").sized(d_model=D)
    assert after.parameters == before.parameters
    assert "qk_norm_order=after_rope" in after_rope().extra_repr()
    assert "qk_norm_order" not in make(qk_norm="rmsnorm").extra_repr()


def test_after_rope_over_all_heads_is_refused() -> None:
    with pytest.raises(ValidationError, match="qk_norm_order after_rope .* not all"):
        CausalSelfAttentionParams(n_heads=4, qk_norm="rmsnorm", qk_norm_scope="all", qk_norm_order="after_rope")
