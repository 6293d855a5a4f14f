"""RMSNorm by its formula, in each dtype, and against transformers' Llama and Gemma norms."""

from __future__ import annotations

import pytest
import torch

from specformer_layers.norms.params import RMSNormParams
from specformer_layers.norms.rmsnorm import RMSNorm


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float) -> torch.Tensor:
    x64 = x.double()
    return x64 / torch.sqrt((x64 ** 2).mean(-1, keepdim=True) + eps) * (weight.double() + offset)


@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_formula(offset: float, dtype: torch.dtype) -> None:
    norm = RMSNorm(RMSNormParams(eps=1e-5, offset=offset), dim=16).to(dtype)
    norm.weight.data.normal_()
    x = torch.randn(3, 5, 16, dtype=dtype) * 3
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(norm(x).double(), reference(x, norm.weight, 1e-5, offset), rtol=tol, atol=tol)
    assert norm(x).dtype == dtype


def test_offset_one_starts_as_identity_scale() -> None:
    norm = RMSNorm(RMSNormParams(offset=1.0), dim=8)
    assert torch.equal(norm.weight, torch.zeros(8))
    x = torch.randn(2, 8)
    torch.testing.assert_close(norm(x), RMSNorm(dim=8)(x))
    norm.weight.data.fill_(3.0)
    norm.init_weights(std=0.02, residual_std=0.01)
    assert torch.equal(norm.weight, torch.zeros(8))


def test_matches_llama_in_bfloat16() -> None:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    ours, theirs = RMSNorm(RMSNormParams(eps=1e-5), dim=32), LlamaRMSNorm(32, eps=1e-5)
    theirs.weight.data.normal_()
    ours.weight.data.copy_(theirs.weight.data)
    ours, theirs = ours.bfloat16(), theirs.bfloat16()
    x = torch.randn(4, 32).bfloat16()
    assert torch.equal(ours(x), theirs(x))


def test_matches_gemma_in_bfloat16() -> None:
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm

    ours, theirs = RMSNorm(RMSNormParams(eps=1e-6, offset=1.0), dim=32), GemmaRMSNorm(32, eps=1e-6)
    theirs.weight.data.normal_()
    ours.weight.data.copy_(theirs.weight.data)
    ours, theirs = ours.bfloat16(), theirs.bfloat16()
    x = torch.randn(4, 32).bfloat16()
    torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=0)


def test_without_a_weight_it_only_normalises() -> None:
    """weight: false is x / sqrt(mean(x^2) + eps), no parameter (Gemma 4's value norm), in float32 for bfloat16."""
    norm = RMSNorm(RMSNormParams(eps=1e-6, weight=False), dim=8)
    assert list(norm.parameters()) == []
    x = torch.randn(3, 8, dtype=torch.float64)
    torch.testing.assert_close(norm(x), x / (x.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt(), rtol=1e-12, atol=1e-12)
    low = x.bfloat16()
    wide = low.float()
    assert norm(low).dtype == torch.bfloat16
    torch.testing.assert_close(norm(low).float(), wide / (wide.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt(),
                               rtol=1e-2, atol=1e-2)


def test_an_offset_without_a_weight_is_refused() -> None:
    with pytest.raises(ValueError, match=r"offset \(1.0\) is added to the weight, so it needs weight: true"):
        RMSNormParams(offset=1.0, weight=False)
