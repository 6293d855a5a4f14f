"""Fixed sinusoidal position encodings (Vaswani et al. 2017)."""

from __future__ import annotations

import math

import torch
from pydantic import Field
from torch import Tensor

from specformer.registry.params import FromParams, Params
from specformer.model.positional import PositionalScheme
from specformer_layers.positional.fp32 import Float32Tables, table_device


class SinusoidalPositions(FromParams, PositionalScheme, Float32Tables):
    """sin/cos of the position at geometrically spaced frequencies, added to the embeddings.

    ``PE[p, 2i] = sin(p / base^(2i/d))``, ``PE[p, 2i+1] = cos(p / base^(2i/d))``.
    Computed from the positions on every forward, so it has no length limit.
    """

    #: Computable at any position, but added to the embeddings of a model trained up to
    #: context_length only: generation refuses to go past it (the issue's rule for such schemes).
    extrapolates = "no"

    class Params(Params):
        base: float = Field(default=10000.0, gt=1, description="The wavelength base (10000 in the paper).")

    def __init__(self, *, d_model: int, base: float = 10000.0) -> None:
        super().__init__()
        if d_model % 2:
            raise ValueError(f"sinusoidal positions need an even d_model, got {d_model}")
        exponents = torch.arange(0, d_model, 2, dtype=torch.float32, device=table_device((d_model + 1) // 2)) / d_model
        self.register_table("inv_freq", torch.exp(-math.log(base) * exponents))  # float32 whatever the model's dtype

    def embed(self, positions: Tensor) -> Tensor:
        angles = positions.clamp(min=0).float()[..., None] * self.inv_freq  # (B, T, d/2)
        table = torch.stack((angles.sin(), angles.cos()), dim=-1)  # (B, T, d/2, 2)
        return table.flatten(-2)  # (B, T, d): sin, cos interleaved
