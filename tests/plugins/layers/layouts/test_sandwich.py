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


def test_depth_scaled_residual_weights_each_add_by_its_count() -> None:
    """Beam: x = x sqrt((k-1)/k) + n(f(n(x))) / sqrt(k), k = 2l+2 at the mixer and 2l+3 at the FFN of layer l."""
    import math

    import pytest

    import specformer
    from specformer_layers.layouts.params import SandwichBlockParams
    from tests.fixtures.tiny import tiny_spec

    attn, ffn = StubAttention(D), StubFFN(D)
    x = torch.randn(2, 3, D, dtype=torch.float64)
    for layer, r in ((0, 1.0), (3, 1.0), (2, 0.5)):
        block = SandwichBlock(SandwichBlockParams(depth_scaled_residual=True, residual_multiplier=r), mixer=attn,
                              ffn=ffn, make_norm=norm_maker(), layer_index=layer)
        k = 2 * layer + 2
        h = x * math.sqrt((k - 1) / k) + r * block.attention_post_norm(attn(block.attention_norm(x), None)) / math.sqrt(k)
        k = 2 * layer + 3
        want = h * math.sqrt((k - 1) / k) + r * block.ffn_post_norm(ffn(block.ffn_norm(h))) / math.sqrt(k)
        torch.testing.assert_close(block(x, None), want)
    # layer 0's mixer add: k = 2, both halves at 1/sqrt(2)
    assert SandwichBlockParams(depth_scaled_residual=True).depth_scales(0)[0] == pytest.approx((2 ** -0.5, 2 ** -0.5))

    # Built from a spec, each block takes its own layer's index.
    model = specformer.build(tiny_spec(n_layers=3, block={"layout": {"kind": "sandwich", "depth_scaled_residual": True}}),
                             seed=0)
    assert [b.add_scales[1][1] for b in model.blocks] == pytest.approx([1 / math.sqrt(2 * i + 3) for i in range(3)])
    spec = tiny_spec(block={"layout": {"kind": "sandwich", "depth_scaled_residual": True}, "residual": {"kind": "mhc"}})
    with pytest.raises(Exception, match="depth_scaled_residual acts on a single residual stream"):
        specformer.build(spec, seed=0)
