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


def test_deepnorm_scales_and_the_normed_residual_follow_minimax() -> None:
    """MiniMax-01's layer: h = n1(x); y = a1 h + b1 attn(h); z = n2(y); out = a2 z + b2 ffn(z)."""
    import pytest

    import specformer
    from specformer_layers.layouts.params import PreNormBlockParams
    from tests.fixtures.tiny import tiny_spec

    attn, ffn = StubAttention(D), StubFFN(D)
    params = PreNormBlockParams(normed_residual=True, residual_scales=(3.5, 1.5), output_scales=(0.5, 2.0),
                                residual_multiplier=0.8)
    block = PreNormBlock(params, mixer=attn, ffn=ffn, make_norm=norm_maker())
    x = torch.randn(2, 3, D, dtype=torch.float64)
    h = block.attention_norm(x)
    y = 3.5 * h + 0.5 * 0.8 * attn(h, None)
    z = block.ffn_norm(y)
    torch.testing.assert_close(block(x, None), 1.5 * z + 2.0 * 0.8 * ffn(z))

    # Without normed_residual the scales act on the stream itself (DeepNorm's x = a x + b f(n(x))).
    block = PreNormBlock(PreNormBlockParams(residual_scales=(2.0, 3.0), output_scales=(0.5, 0.25)), mixer=attn,
                         ffn=ffn, make_norm=norm_maker())
    y = 2.0 * x + 0.5 * attn(block.attention_norm(x), None)
    torch.testing.assert_close(block(x, None), 3.0 * y + 0.25 * ffn(block.ffn_norm(y)))

    spec = tiny_spec(block={"layout": {"kind": "prenorm", "normed_residual": True}, "residual": {"kind": "mhc"}})
    with pytest.raises(Exception, match="normed_residual and residual_scales act on a single residual stream"):
        specformer.build(spec, seed=0)


def test_without_the_mixer_pre_norm_the_mixer_reads_the_raw_stream() -> None:
    """ModernBERT-decoder's first layer: x = x + attn(x); x = x + ffn(n(x)), and no attention_norm is made."""
    import specformer
    from specformer_layers.layouts.params import PreNormBlockParams
    from tests.fixtures.tiny import tiny_spec

    attn, ffn = StubAttention(D), StubFFN(D)
    block = PreNormBlock(PreNormBlockParams(mixer_pre_norm=False), mixer=attn, ffn=ffn, make_norm=norm_maker())
    assert block.attention_norm is None and block.ffn_norm.scale == 1.0  # the first norm made is the ffn's
    x = torch.randn(2, 3, D, dtype=torch.float64)
    h = x + attn(x, None)
    torch.testing.assert_close(block(x, None), h + ffn(block.ffn_norm(h)), rtol=0, atol=0)

    # Set on layer 0 alone by an override: that block has one norm fewer, the size check agrees with the build.
    spec = tiny_spec(layers=[{"select": 0, "layout": {"mixer_pre_norm": False}}])
    model = specformer.build(spec, seed=0)
    assert model.blocks[0].attention_norm is None and model.blocks[1].attention_norm is not None
    from specformer.spec.size_check import check_sizes
    from specformer.spec.validate import validate

    counted = check_sizes(validate(spec, registry=specformer.get_registry()).resolved).parameters
    assert counted == sum(p.numel() for p in model.parameters())
