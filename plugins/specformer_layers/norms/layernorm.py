"""Layer normalisation (Ba et al. 2016)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from specformer.registry.params import FromParams, Params


class LayerNorm(FromParams, nn.Module):
    """Subtract the mean, divide by the standard deviation, then scale (and shift) per channel.

    ``y = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias``. ``bias: false`` drops the
    shift (as in nanoGPT's bias-free configs); ``affine: false`` drops both (OLMo).
    """

    class Params(Params):
        eps: float = Field(default=1e-5, gt=0, description="Added to the variance for stability.")
        bias: bool = Field(default=True, description="Learn a per-channel shift.")
        affine: bool = Field(default=True, description="Learn a per-channel scale (and shift); false = non-parametric.")

    def __init__(self, *, dim: int, eps: float = 1e-5, bias: bool = True, affine: bool = True) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None
        self.bias = nn.Parameter(torch.zeros(dim)) if affine and bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, (self.dim,), self.weight, self.bias, self.eps)

    def init_weights(self, *, std: float, residual_std: float) -> None:
        if self.weight is not None:
            nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)
