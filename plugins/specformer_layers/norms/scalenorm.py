"""ScaleNorm (Nguyen & Salazar 2019): one learned length for every vector."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from specformer.model.parallel_plan import ParallelPlan

from specformer_layers.norms.params import ScaleNormParams


class ScaleNorm(nn.Module):
    """ScaleNorm over the last ``dim`` channels: one learned length per norm; what it computes: :class:`ScaleNormParams`."""

    Params = ScaleNormParams

    def __init__(self, params: ScaleNormParams | None = None, *, dim: int) -> None:
        params = params if params is not None else ScaleNormParams()
        super().__init__()
        self.dim = dim
        self.eps = params.eps
        self.scale = nn.Parameter(torch.full((1,), math.sqrt(dim)))

    def parallel_plan(self) -> ParallelPlan:
        """Replicated: under sequence parallelism each device normalises its own slice of the tokens."""
        return {}

    def forward(self, x: Tensor) -> Tensor:
        h = x if x.dtype in (torch.float32, torch.float64) else x.float()
        norm = torch.linalg.vector_norm(h, dim=-1, keepdim=True).clamp(min=self.eps)
        return (h * (self.scale.to(h.dtype) / norm)).to(x.dtype)

    def init_weights(self, *, std: float, residual_std: float) -> None:
        nn.init.constant_(self.scale, math.sqrt(self.dim))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, eps={self.eps}"
