"""OLMo-2's wiring by its formula."""

from __future__ import annotations

import torch

from specformer_layers.layouts.postnorm_inside import PostNormInsideBlock

from .stubs import D, StubAttention, StubFFN, norm_maker


def test_formula() -> None:
    attn, ffn = StubAttention(D), StubFFN(D)
    block = PostNormInsideBlock(mixer=attn, ffn=ffn, make_norm=norm_maker())
    x = torch.randn(2, 3, D, dtype=torch.float64)
    h = x + block.attention_norm(attn(x, None))
    torch.testing.assert_close(block(x, None), h + block.ffn_norm(ffn(h)), rtol=0, atol=0)  # the same operations: bit for bit
