"""Root-mean-square normalisation (Zhang & Sennrich 2019)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from specformer.registry.params import FromParams, Params


class RMSNorm(FromParams, nn.Module):
    """Divide by the root mean square of the channels, then scale: ``x / sqrt(mean(x^2) + eps) * (offset + weight)``.

    Lower-precision inputs are normalised in float32, as Llama and Gemma do (float64 stays
    float64). ``offset: 1`` stores the scale as ``weight - 1`` (Gemma), so the weight
    initialises to zero.
    """

    class Params(Params):
        eps: float = Field(default=1e-6, gt=0, description="Added to the mean square for stability.")
        offset: float = Field(default=0.0, description="Added to the weight before scaling (1.0 for Gemma).")

    def __init__(self, *, dim: int, eps: float = 1e-6, offset: float = 0.0) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.offset = offset
        self.weight = nn.Parameter(torch.full((dim,), 1.0 - offset))

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype in (torch.float32, torch.float64):
            weight = self.weight if self.weight.dtype == x.dtype else self.weight.to(x.dtype)
            return F.rms_norm(x, (self.dim,), weight + self.offset if self.offset else weight, self.eps)
        normed = F.rms_norm(x.float(), (self.dim,), None, self.eps)
        if self.offset:  # Gemma multiplies in float32, then casts
            return (normed * (self.weight.float() + self.offset)).to(x.dtype)
        return normed.to(x.dtype) * self.weight  # Llama casts, then multiplies

    def init_weights(self, *, std: float, residual_std: float) -> None:
        nn.init.constant_(self.weight, 1.0 - self.offset)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, eps={self.eps}, offset={self.offset}"
