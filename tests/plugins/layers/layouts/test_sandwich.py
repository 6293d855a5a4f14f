"""Sandwich wiring (Gemma 2) by its formula."""

from __future__ import annotations

import torch

from specformer_layers.layouts.sandwich import SandwichBlock

from .stubs import D, StubAttention, StubFFN, norm_maker


def test_formula() -> None:
    attn, ffn = StubAttention(D), StubFFN(D)
    block = SandwichBlock(mixer=attn, ffn=ffn, make_norm=norm_maker())
    norms = [block.attention_norm, block.attention_post_norm, block.ffn_norm, block.ffn_post_norm]
    assert len({id(n) for n in norms}) == 4
    x = torch.randn(2, 3, D, dtype=torch.float64)
    h = x + block.attention_post_norm(attn(block.attention_norm(x), None))
    torch.testing.assert_close(block(x, None), h + block.ffn_post_norm(ffn(block.ffn_norm(h))), rtol=0, atol=0)  # the same operations: bit for bit


def test_residual_multiplier_scales_each_post_normed_output() -> None:
    from specformer_layers.layouts.params import SandwichBlockParams

    attn, ffn = StubAttention(D), StubFFN(D)
    block = SandwichBlock(SandwichBlockParams(residual_multiplier=0.3), mixer=attn, ffn=ffn, make_norm=norm_maker())
    x = torch.randn(2, 3, D, dtype=torch.float64)
    # HyperCLOVA X: the multiplier comes after the post norm, so it is not undone by it.
    h = x + block.attention_post_norm(attn(block.attention_norm(x), None)) * 0.3
    expected = h + block.ffn_post_norm(ffn(block.ffn_norm(h))) * 0.3
    torch.testing.assert_close(block(x, None), expected, rtol=0, atol=0)
