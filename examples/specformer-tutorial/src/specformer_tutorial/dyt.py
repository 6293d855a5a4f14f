"""Dynamic Tanh, a drop-in replacement for normalisation layers (Zhu et al. 2025)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from specformer_tutorial.params import DyTParams


class DyT(nn.Module):
    """Dynamic Tanh over the last ``dim`` channels; what it computes and its settings: :class:`DyTParams`."""

    Params = DyTParams

    def __init__(self, params: DyTParams | None = None, *, dim: int) -> None:
        super().__init__()
        params = params if params is not None else DyTParams()
        self.alpha_init = params.alpha_init
        self.alpha = nn.Parameter(torch.tensor(float(params.alpha_init)))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if params.bias else None

    def forward(self, x: Tensor) -> Tensor:
        y = torch.tanh(self.alpha * x) * self.weight
        return y + self.bias if self.bias is not None else y

    def init_weights(self, *, std: float, residual_std: float) -> None:
        # Decoder.init_weights calls this after building; a norm ignores the std of the matmuls.
        with torch.no_grad():
            self.alpha.fill_(self.alpha_init)
            nn.init.ones_(self.weight)
            if self.bias is not None:
                nn.init.zeros_(self.bias)
