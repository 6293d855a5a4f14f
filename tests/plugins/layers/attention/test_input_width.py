"""Attention that reads a wider input than it writes (input_width: Zamba's shared attention over concat(stream,
embeddings)), against the formula written out."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from specformer_layers.attention.causal import CausalSelfAttention
from specformer_layers.attention.params import CausalSelfAttentionParams
from specformer_layers.positional.rope import RotaryPositions

from ..support import causal_positions, context

D, WIDE, H, KV, HD = 12, 24, 3, 1, 8  # reads 24 channels, writes 12; 3 heads of 8 (3 * 8 = the input width)


def test_the_projections_read_input_width_and_the_output_is_d_model_wide() -> None:
    params = CausalSelfAttentionParams(n_heads=H, n_kv_heads=KV, head_dim=HD, input_width=WIDE, scale=0.3,
                                       output_gate=True)
    attention = CausalSelfAttention(params, d_model=D).double()
    for p in attention.parameters():
        p.data.normal_(0, 0.3)
    assert attention.qkv.weight.shape == (H * HD + 2 * KV * HD, WIDE) and attention.out.weight.shape == (D, H * HD)
    assert attention.gate.weight.shape == (H * HD, WIDE)  # the gate reads the input too
    built = sum(p.numel() for p in attention.parameters())
    assert params.sized(d_model=D).parameters == built
    rope = RotaryPositions(head_dim=HD, context_length=16)
    B, T = 2, 6
    x = torch.randn(B, T, WIDE, dtype=torch.float64)
    positions = causal_positions(B, T)
    got = attention(x, context(positions, rope, plain_causal=True))  # (B, T, D)
    # Written out: q, k, v from the wide input, RoPE, causal softmax(q k^T * 0.3) v per head, output gate, out.
    q, k, v = (x @ attention.qkv.weight.T).split((H * HD, KV * HD, KV * HD), dim=-1)
    q, k, v = (t.view(B, T, -1, HD).transpose(1, 2) for t in (q, k, v))  # (B, heads, T, HD)
    state = rope.prepare(positions)
    q, k = rope.rotate(q, state), rope.rotate(k, state)
    k, v = k.expand(B, H, T, HD), v.expand(B, H, T, HD)  # one kv head for all
    scores = (q @ k.transpose(-1, -2) * 0.3).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    y = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, H * HD)
    y = y * torch.sigmoid(x @ attention.gate.weight.T)
    torch.testing.assert_close(got, y @ attention.out.weight.T)


def test_input_width_with_an_indexer_is_refused() -> None:
    with pytest.raises(ValidationError, match="input_width and indexer do not combine"):
        CausalSelfAttentionParams(n_heads=2, input_width=8, indexer={"kind": "block_pooled", "n_heads": 1,
                                                                       "block_size": 4, "topk": 2})
