"""prediction_head (BERT's head transform after the final norm) by its formula and against ModernBERT's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specformer_layers.norms.prediction_head import PredictionHead
from specformer_layers.norms.prediction_head_params import PredictionHeadParams


def randomised(head: PredictionHead) -> PredictionHead:
    with torch.no_grad():
        for p in head.parameters():
            p.normal_()
    return head


@pytest.mark.parametrize("bias", [False, True])
def test_formula(bias: bool) -> None:
    """``LN2(gelu(W LN1(x) + b))``, each layer norm written out with its own weight and shift."""
    params = PredictionHeadParams.model_validate({"norm": {"kind": "layernorm", "eps": 1e-3}, "bias": bias})
    head = randomised(PredictionHead(params, dim=8)).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64) * 3

    def layer_norm(v: torch.Tensor, weight: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
        mean = v.mean(-1, keepdim=True)
        var = ((v - mean) ** 2).mean(-1, keepdim=True)
        return (v - mean) / torch.sqrt(var + 1e-3) * weight + shift

    h = layer_norm(x, head.norm.weight, head.norm.bias)
    h = h @ head.dense.weight.T + (head.dense.bias if bias else 0)
    h = 0.5 * h * (1 + torch.erf(h / 2 ** 0.5))  # exact gelu
    expected = layer_norm(h, head.head_norm.weight, head.head_norm.bias)
    torch.testing.assert_close(head(x), expected, rtol=1e-12, atol=1e-12)
    assert (head.dense.bias is not None) == bias


def test_sizes_match_the_build() -> None:
    for spec in ({}, {"bias": True}, {"norm": {"kind": "rmsnorm"}}, {"norm": {"kind": "layernorm", "bias": False}}):
        params = PredictionHeadParams.model_validate(spec)
        assert params.sized(dim=12).parameters == sum(p.numel() for p in PredictionHead(params, dim=12).parameters())


def test_matches_modernbert_decoder_after_its_final_norm() -> None:
    from transformers import ModernBertDecoderConfig
    from transformers.models.modernbert_decoder.modeling_modernbert_decoder import ModernBertDecoderPredictionHead

    config = ModernBertDecoderConfig(hidden_size=16, norm_eps=1e-4, norm_bias=True, classifier_bias=True)
    theirs, final_norm = ModernBertDecoderPredictionHead(config), torch.nn.LayerNorm(16, eps=1e-4)
    params = PredictionHeadParams.model_validate({"norm": {"kind": "layernorm", "eps": 1e-4}, "bias": True})
    ours = randomised(PredictionHead(params, dim=16))
    with torch.no_grad():
        for mine, other in ((ours.norm, final_norm), (ours.dense, theirs.dense), (ours.head_norm, theirs.norm)):
            other.weight.copy_(mine.weight)
            other.bias.copy_(mine.bias)
    x = torch.randn(3, 4, 16)
    torch.testing.assert_close(ours(x), theirs(final_norm(x)), rtol=1e-6, atol=1e-6)


def test_as_the_final_norm_of_a_model() -> None:
    import specformer
    from tests.fixtures.tiny import tiny_spec

    model = specformer.build(tiny_spec(final_norm={"kind": "prediction_head", "norm": "rmsnorm", "activation": "silu"}),
                             seed=0)
    assert isinstance(model.final_norm, PredictionHead)
    x = torch.randn(1, 3, model.final_norm.dense.in_features)
    h = model.final_norm.norm(x)
    torch.testing.assert_close(model.final_norm(x), model.final_norm.head_norm(F.silu(model.final_norm.dense(h))))
