"""Dynamic Tanh, a drop-in replacement for normalisation layers (Zhu et al. 2025)."""

from __future__ import annotations

import torch
from pydantic import Field
from specformer.registry.params import FromParams, Params
from torch import Tensor, nn


class DyT(FromParams, nn.Module):
    """Squash each channel with a learned-steepness tanh, then scale and shift: ``weight * tanh(alpha * x) + bias``.

    No statistics are computed over the channels: ``alpha`` is one learned scalar,
    ``weight`` and ``bias`` are per channel. The paper finds it matches LayerNorm and
    RMSNorm in trained transformers when ``alpha`` starts small (0.5 by default).
    """

    class Params(Params):
        alpha_init: float = Field(default=0.5, gt=0, description="Starting value of the learned steepness alpha.")
        bias: bool = Field(default=True, description="Learn a per-channel shift after the scale.")

    def __init__(self, *, dim: int, alpha_init: float = 0.5, bias: bool = True) -> None:
        super().__init__()
        if alpha_init <= 0:
            raise ValueError(f"alpha_init must be > 0, got {alpha_init}")
        self.alpha_init = alpha_init
        self.alpha = nn.Parameter(torch.tensor(float(alpha_init)))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

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
