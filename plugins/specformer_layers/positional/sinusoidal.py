"""Fixed sinusoidal position encodings (Vaswani et al. 2017)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from specformer.model.positional import PositionalScheme
from specformer_layers.positional.fp32 import Float32Tables, table_device
from specformer_layers.positional.params import SinusoidalPositionsParams


class SinusoidalPositions(PositionalScheme, Float32Tables):
    """Fixed sinusoidal encodings added to the embeddings: :class:`SinusoidalPositionsParams`."""

    #: Computable at any position, but added to the embeddings of a model trained up to
    #: context_length only: generation refuses to go past it (the issue's rule for such schemes).
    extrapolates = "no"

    Params = SinusoidalPositionsParams

    def __init__(self, params: SinusoidalPositionsParams | None = None, *, d_model: int) -> None:
        params = params if params is not None else SinusoidalPositionsParams()
        super().__init__()
        params.sized(d_model=d_model)  # an even d_model
        self.offset, self.split_halves = params.offset, params.split_halves
        device = table_device((d_model + 1) // 2)
        if params.frequencies == "half_minus_one":
            # fairseq's own arithmetic (step first, then one product per pair), so that its tables come out bit for bit
            step = math.log(params.base) / (d_model // 2 - 1)
            inv_freq = torch.exp(torch.arange(d_model // 2, dtype=torch.float32, device=device) * -step)
        else:
            exponents = torch.arange(0, d_model, 2, dtype=torch.float32, device=device) / d_model
            inv_freq = torch.exp(-math.log(params.base) * exponents)
        self.register_table("inv_freq", inv_freq)  # float32 whatever the model's dtype

    def embed(self, positions: Tensor) -> Tensor:
        angles = (positions.clamp(min=0) + self.offset).float()[..., None] * self.inv_freq  # (B, T, d/2)
        if self.split_halves:
            return torch.cat((angles.sin(), angles.cos()), dim=-1)  # (B, T, d): every sin, then every cos
        table = torch.stack((angles.sin(), angles.cos()), dim=-1)  # (B, T, d/2, 2)
        return table.flatten(-2)  # (B, T, d): sin, cos interleaved
