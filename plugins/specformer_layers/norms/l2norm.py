"""Weightless length normalisation of queries and keys (Llama 4's qk norm)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from specformer.model.parallel_plan import ParallelPlan

from specformer_layers.norms.params import L2NormParams


class L2Norm(nn.Module):
    """Each vector over the last ``dim`` channels scaled to root mean square 1; no weights (:class:`L2NormParams`)."""

    Params = L2NormParams

    def __init__(self, params: L2NormParams | None = None, *, dim: int) -> None:
        params = params if params is not None else L2NormParams()
        super().__init__()
        self.dim = dim
        self.eps = params.eps

    def parallel_plan(self) -> ParallelPlan:
        """Replicated: under sequence parallelism each device normalises its own slice of the tokens."""
        return {}

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype in (torch.float32, torch.float64):
            return F.rms_norm(x, (self.dim,), None, self.eps)
        return F.rms_norm(x.float(), (self.dim,), None, self.eps).to(x.dtype)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, eps={self.eps}"
