"""Root-mean-square normalisation (Zhang & Sennrich 2019)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from specformer.model.parallel_plan import ParallelPlan

from specformer_layers.norms.params import RMSNormParams


class RMSNorm(nn.Module):
    """Root-mean-square normalisation over the last ``dim`` channels; what it computes: :class:`RMSNormParams`."""

    Params = RMSNormParams

    def __init__(self, params: RMSNormParams | None = None, *, dim: int) -> None:
        params = params if params is not None else RMSNormParams()
        super().__init__()
        self.dim = dim
        self.eps = params.eps
        self.offset = params.offset
        self.weight = nn.Parameter(torch.full((dim,), 1.0 - params.offset)) if params.weight else None

    def parallel_plan(self) -> ParallelPlan:
        """Replicated: under sequence parallelism each device normalises its own slice of the tokens."""
        return {}

    def forward(self, x: Tensor) -> Tensor:
        if self.weight is None:  # no learned scale: the normalisation alone, in float32 for lower precisions
            wide = x if x.dtype in (torch.float32, torch.float64) else x.float()
            return F.rms_norm(wide, (self.dim,), None, self.eps).to(x.dtype)
        if x.dtype in (torch.float32, torch.float64):
            weight = self.weight if self.weight.dtype == x.dtype else self.weight.to(x.dtype)
            return F.rms_norm(x, (self.dim,), weight + self.offset if self.offset else weight, self.eps)
        normed = F.rms_norm(x.float(), (self.dim,), None, self.eps)
        if self.offset:  # Gemma multiplies in float32, then casts
            return (normed * (self.weight.float() + self.offset)).to(x.dtype)
        return normed.to(x.dtype) * self.weight  # Llama casts, then multiplies

    def init_weights(self, *, std: float, residual_std: float) -> None:
        if self.weight is not None:
            nn.init.constant_(self.weight, 1.0 - self.offset)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, eps={self.eps}, offset={self.offset}" + ("" if self.weight is not None else ", weight=False")
