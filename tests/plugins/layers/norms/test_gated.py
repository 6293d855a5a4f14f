"""The low-rank gated norm by its formula, against A.X-K2's, and as a model's block norm."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specformer_layers.norms.gated import GatedNorm
from specformer_layers.norms.gated_params import GatedNormParams


def randomised(norm: GatedNorm) -> GatedNorm:
    with torch.no_grad():
        for p in norm.parameters():
            p.normal_()
    return norm


@pytest.mark.parametrize("activation", ["silu", "gelu"])
def test_formula(activation: str) -> None:
    """``y * sigmoid(U act(D y))`` with ``y`` the RMSNorm written out."""
    params = GatedNormParams.model_validate({"norm": {"kind": "rmsnorm", "eps": 1e-3}, "rank": 3,
                                             "activation": activation})
    norm = randomised(GatedNorm(params, dim=8)).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64) * 3
    y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-3) * norm.norm.weight
    h = y @ norm.down.weight.T  # (2, 5, 3): the bottleneck
    h = h / (1 + torch.exp(-h)) if activation == "silu" else 0.5 * h * (1 + torch.erf(h / 2 ** 0.5))
    expected = y / (1 + torch.exp(-(h @ norm.up.weight.T)))
    torch.testing.assert_close(norm(x), expected, rtol=1e-12, atol=1e-12)
    assert (norm.down.weight.shape, norm.up.weight.shape) == ((3, 8), (8, 3))


def test_sizes_match_the_build() -> None:
    for spec in ({}, {"rank": 5}, {"norm": {"kind": "layernorm"}}, {"norm": {"kind": "rmsnorm", "weight": False}}):
        params = GatedNormParams.model_validate(spec)
        assert params.sized(dim=12).parameters == sum(p.numel() for p in GatedNorm(params, dim=12).parameters())


def test_bad_rank_is_refused() -> None:
    with pytest.raises(ValueError, match="rank"):
        GatedNormParams.model_validate({"rank": 0})


def test_matches_axk2_gated_rmsnorm() -> None:
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "AXK2Config"):
        pytest.skip("this transformers has no A.X-K2")
    from transformers.models.axk2.modeling_axk2 import AXK2GatedRMSNorm

    config = transformers.AXK2Config(hidden_size=16, gated_norm_rank=4, rms_norm_eps=1e-5)
    theirs = AXK2GatedRMSNorm(config)
    ours = randomised(GatedNorm(GatedNormParams.model_validate({"norm": {"kind": "rmsnorm", "eps": 1e-5}, "rank": 4}),
                                dim=16))
    with torch.no_grad():
        theirs.norm.weight.copy_(ours.norm.weight)
        theirs.mlp.fc1.weight.copy_(ours.down.weight)
        theirs.mlp.fc2.weight.copy_(ours.up.weight)
    x = torch.randn(3, 4, 16)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-6, atol=1e-6)


def test_as_block_norm_with_a_plain_ffn_norm() -> None:
    """The block norm gated, the FFN's plain on layer 0 (prenorm ffn_norm): A.X-K2's dense layers; sizes agree."""
    import specformer
    from specformer.spec.size_check import check_sizes
    from specformer.spec.validate import validate
    from specformer_layers.norms.rmsnorm import RMSNorm
    from tests.fixtures.tiny import tiny_spec

    spec = tiny_spec(block={"norm": {"kind": "gated", "rank": 2}},
                     layers=[{"select": 0, "layout": {"kind": "prenorm", "ffn_norm": {"kind": "rmsnorm", "eps": 1e-4}}}])
    model = specformer.build(spec, seed=0)
    first, second = model.blocks[0], model.blocks[1]
    assert isinstance(first.attention_norm, GatedNorm) and isinstance(first.ffn_norm, RMSNorm)
    assert first.ffn_norm.eps == 1e-4 and isinstance(second.ffn_norm, GatedNorm)
    counted = check_sizes(validate(spec, registry=specformer.get_registry()).resolved).parameters
    assert counted == sum(p.numel() for p in model.parameters())
    norm = first.attention_norm
    x = torch.randn(1, 3, norm.down.in_features)
    y = norm.norm(x)
    torch.testing.assert_close(norm(x), y * torch.sigmoid(norm.up(F.silu(norm.down(y)))))
    with torch.no_grad():
        out = model(torch.tensor([[1, 2, 3]]))
    assert torch.isfinite(out if isinstance(out, torch.Tensor) else out.logits).all()
