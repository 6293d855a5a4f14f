"""Post-norm wiring by its formula."""

from __future__ import annotations

import torch

from specformer_layers.layouts.postnorm import PostNormBlock

from .stubs import D, StubAttention, StubFFN, norm_maker


def test_formula() -> None:
    attn, ffn = StubAttention(D), StubFFN(D)
    block = PostNormBlock(mixer=attn, ffn=ffn, make_norm=norm_maker())
    x = torch.randn(2, 3, D, dtype=torch.float64)
    h = block.attention_norm(x + attn(x, None))
    torch.testing.assert_close(block(x, None), block.ffn_norm(h + ffn(h)), rtol=0, atol=0)  # the same operations: bit for bit
