"""Pre-norm wiring by its formula."""

from __future__ import annotations

import torch

from specformer_layers.layouts.prenorm import PreNormBlock

from .stubs import D, StubAttention, StubFFN, norm_maker


def test_formula() -> None:
    attn, ffn = StubAttention(D), StubFFN(D)
    block = PreNormBlock(mixer=attn, ffn=ffn, make_norm=norm_maker())
    x = torch.randn(2, 3, D, dtype=torch.float64)
    h = x + attn(block.attention_norm(x), None)
    torch.testing.assert_close(block(x, None), h + ffn(block.ffn_norm(h)), rtol=0, atol=0)  # the same operations: bit for bit
    assert (block.attention_norm.scale, block.ffn_norm.scale) == (1.0, 2.0)
