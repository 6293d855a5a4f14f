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


def test_residual_gate_mixes_each_add_by_its_learned_weights() -> None:
    """Ergo: x = sigmoid(w) out + sqrt(1 + sigmoid(w)) exp(-softplus(w) / 2) x, one w per add, per channel."""
    import math

    import pytest

    import specformer
    from specformer_layers.layouts.params import SandwichBlockParams
    from tests.fixtures.tiny import tiny_spec

    attn, ffn = StubAttention(D), StubFFN(D)
    block = SandwichBlock(SandwichBlockParams(residual_gate=True), mixer=attn, ffn=ffn, make_norm=norm_maker(),
                          d_model=D).double()
    x = torch.randn(2, 3, D, dtype=torch.float64)
    # At their zero initialisation both gates are constants: out / 2 + x sqrt(3/2) / sqrt(2) = out / 2 + x sqrt(3) / 2.
    h = 0.5 * block.attention_post_norm(attn(block.attention_norm(x), None)) + math.sqrt(3) / 2 * x
    want = 0.5 * block.ffn_post_norm(ffn(block.ffn_norm(h))) + math.sqrt(3) / 2 * h
    torch.testing.assert_close(block(x, None), want)

    def gated(w: torch.Tensor, out: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
        s = 1 / (1 + torch.exp(-w))
        return s * out + torch.sqrt((1 + s) / (1 + torch.exp(w))) * base  # exp(-softplus(w)/2) = (1 + e^w)^(-1/2)

    with torch.no_grad():
        block.attention_residual_gate.normal_(0, 2.0)
        block.ffn_residual_gate.normal_(0, 2.0)
    h = gated(block.attention_residual_gate, block.attention_post_norm(attn(block.attention_norm(x), None)), x)
    want = gated(block.ffn_residual_gate, block.ffn_post_norm(ffn(block.ffn_norm(h))), h)
    torch.testing.assert_close(block(x, None), want)

    # Two gates of d_model per block, counted by the size check as built; refused beside depth scaling or several streams.
    model = specformer.build(tiny_spec(n_layers=2, block={"layout": {"kind": "sandwich", "residual_gate": True}}), seed=0)
    assert model.blocks[1].ffn_residual_gate.shape == (model.blocks[1].ffn_residual_gate.numel(),)
    assert torch.count_nonzero(model.blocks[0].attention_residual_gate) == 0
    with pytest.raises(Exception, match="residual_gate and depth_scaled_residual"):
        SandwichBlockParams(residual_gate=True, depth_scaled_residual=True)
    spec = tiny_spec(block={"layout": {"kind": "sandwich", "residual_gate": True}, "residual": {"kind": "mhc"}})
    with pytest.raises(Exception, match="residual_gate acts on a single residual stream"):
        specformer.build(spec, seed=0)
