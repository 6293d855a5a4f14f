"""Layer normalisation (Ba et al. 2016)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from specformer.model.parallel_plan import ParallelPlan

from specformer_layers.norms.params import LayerNormParams


class LayerNorm(nn.Module):
    """Layer normalisation over the last ``dim`` channels; what it computes: :class:`LayerNormParams`."""

    Params = LayerNormParams

    def __init__(self, params: LayerNormParams | None = None, *, dim: int) -> None:
        params = params if params is not None else LayerNormParams()
        super().__init__()
        self.dim = dim
        self.eps = params.eps
        self.offset = params.offset
        self.weight = nn.Parameter(torch.full((dim,), 1.0 - params.offset)) if params.affine else None
        self.bias = nn.Parameter(torch.zeros(dim)) if params.affine and params.bias else None

    def parallel_plan(self) -> ParallelPlan:
        """Replicated: under sequence parallelism each device normalises its own slice of the tokens."""
        return {}

    def forward(self, x: Tensor) -> Tensor:
        weight = self.weight + self.offset if self.weight is not None and self.offset else self.weight
        return F.layer_norm(x, (self.dim,), weight, self.bias, self.eps)

    def init_weights(self, *, std: float, residual_std: float) -> None:
        if self.weight is not None:
            nn.init.constant_(self.weight, 1.0 - self.offset)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

