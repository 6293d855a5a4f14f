"""l2norm by its formula (no weights), in each dtype, and against transformers' Llama4TextL2Norm."""

from __future__ import annotations

import pytest
import torch

from specformer_layers.norms.l2norm import L2Norm
from specformer_layers.norms.params import L2NormParams


def reference(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps)``: every vector scaled to root mean square 1, nothing learned."""
    x64 = x.double()
    return x64 / torch.sqrt((x64 ** 2).mean(-1, keepdim=True) + eps)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_formula(dtype: torch.dtype) -> None:
    norm = L2Norm(L2NormParams(eps=1e-5), dim=16)
    x = torch.randn(3, 5, 16, dtype=dtype) * 3
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(norm(x).double(), reference(x, 1e-5), rtol=tol, atol=tol)
    assert norm(x).dtype == dtype
    assert list(norm.parameters()) == [] and list(norm.buffers()) == []


def test_bfloat16_is_normalised_in_float32() -> None:
    x = torch.randn(4, 32) * 100
    out = L2Norm(dim=32)(x.bfloat16())
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, reference(x.bfloat16().float(), 1e-6).to(torch.bfloat16), rtol=0, atol=0)


def test_matches_llama4() -> None:
    from transformers.models.llama4.modeling_llama4 import Llama4TextL2Norm

    x = torch.randn(2, 3, 4, 8)
    torch.testing.assert_close(L2Norm(L2NormParams(eps=1e-5), dim=8)(x), Llama4TextL2Norm(1e-5)(x), rtol=1e-6, atol=1e-6)
