"""ScaleNorm (Nguyen & Salazar 2019): one learned length for every vector."""

from __future__ import annotations

import math

import torch
from pydantic import Field
from torch import Tensor, nn

from specformer.registry.params import FromParams, Params


class ScaleNorm(FromParams, nn.Module):
    """Project each vector onto a sphere of learned radius: ``g * x / max(||x||_2, eps)``.

    A single scalar ``g`` per norm, initialised to ``sqrt(dim)`` so that the output has
    unit root mean square at the start, as in the paper. Computed in float32 for
    lower-precision inputs.
    """

    class Params(Params):
        eps: float = Field(default=1e-5, gt=0, description="Lower bound of the vector norm (avoids dividing by zero).")

    def __init__(self, *, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.scale = nn.Parameter(torch.full((1,), math.sqrt(dim)))

    def forward(self, x: Tensor) -> Tensor:
        h = x if x.dtype in (torch.float32, torch.float64) else x.float()
        norm = torch.linalg.vector_norm(h, dim=-1, keepdim=True).clamp(min=self.eps)
        return (h * (self.scale.to(h.dtype) / norm)).to(x.dtype)

    def init_weights(self, *, std: float, residual_std: float) -> None:
        nn.init.constant_(self.scale, math.sqrt(self.dim))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, eps={self.eps}"
