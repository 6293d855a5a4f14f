"""Fixed sinusoidal position encodings (Vaswani et al. 2017)."""

from __future__ import annotations

import math

import torch
from pydantic import Field
from torch import Tensor

from specformer.params import Params
from specformer.positional import PositionalScheme


class SinusoidalPositions(PositionalScheme):
    """sin/cos of the position at geometrically spaced frequencies, added to the embeddings.

    ``PE[p, 2i] = sin(p / base^(2i/d))``, ``PE[p, 2i+1] = cos(p / base^(2i/d))``.
    Computed from the positions on every forward, so it has no length limit.
    """

    class Params(Params):
        base: float = Field(default=10000.0, gt=1, description="The wavelength base (10000 in the paper).")

    def __init__(self, *, d_model: int, base: float = 10000.0) -> None:
        super().__init__()
        if d_model % 2:
            raise ValueError(f"sinusoidal positions need an even d_model, got {d_model}")
        inv_freq = torch.exp(-math.log(base) * torch.arange(0, d_model, 2, dtype=torch.float32) / d_model)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @classmethod
    def from_params(cls, params: Params, *, d_model: int, n_heads: int, head_dim: int, context_length: int) -> "SinusoidalPositions":
        return cls(d_model=d_model, base=params.base)

    def embed(self, positions: Tensor) -> Tensor:
        angles = positions.clamp(min=0).float()[..., None] * self.inv_freq  # (B, T, d/2)
        table = torch.stack((angles.sin(), angles.cos()), dim=-1)  # (B, T, d/2, 2)
        return table.flatten(-2)  # (B, T, d): sin, cos interleaved
