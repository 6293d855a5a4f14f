"""Rotary position embeddings (Su et al. 2021)."""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field
from torch import Tensor

from specformer.params import Params
from specformer.positional import PositionalScheme


class RotaryPositions(PositionalScheme):
    """Rotate each pair of query/key channels by an angle proportional to the position.

    Channel pair ``i`` turns by ``position * theta^(-2i/rotary_dim)``, so the score of a
    query and a key depends on their distance only. ``fraction`` < 1 rotates only the
    first channels of each head (GPT-NeoX, Phi); ``interleaved`` pairs channels (0,1),
    (2,3)... as in the original paper and GPT-J instead of the half-split pairing (i,
    i + d/2) of GPT-NeoX and Llama.
    """

    class Params(Params):
        theta: float = Field(default=10000.0, gt=1, description="Base of the rotation frequencies.")
        fraction: float = Field(default=1.0, gt=0, le=1, description="Share of each head's channels that rotate.")
        interleaved: bool = Field(default=False, description="Pair adjacent channels (GPT-J) instead of halves (NeoX/Llama).")

    def __init__(self, *, head_dim: int, theta: float = 10000.0, fraction: float = 1.0, interleaved: bool = False,
                 inv_freq: Tensor | None = None, attention_scaling: float = 1.0) -> None:
        super().__init__()
        rotary_dim = int(head_dim * fraction)
        rotary_dim -= rotary_dim % 2
        if rotary_dim < 2:
            raise ValueError(f"rope rotates {rotary_dim} channels of head_dim {head_dim} with fraction {fraction}; need at least 2")
        self.head_dim = head_dim
        self.rotary_dim = rotary_dim
        self.interleaved = interleaved
        self.attention_scaling = attention_scaling
        if inv_freq is None:
            inv_freq = default_inv_freq(rotary_dim, theta)
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)

    @classmethod
    def from_params(cls, params: Params, *, d_model: int, n_heads: int, head_dim: int, context_length: int) -> "RotaryPositions":
        return cls(head_dim=head_dim, theta=params.theta, fraction=params.fraction, interleaved=params.interleaved)

    def prepare(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        # In fp32 whatever the model dtype: angles of large positions lose precision in bf16.
        angles = positions.float()[..., None] * self.inv_freq  # (B, T, rotary_dim/2)
        cos = (angles.cos() * self.attention_scaling)[:, None]  # (B, 1, T, rotary_dim/2)
        sin = (angles.sin() * self.attention_scaling)[:, None]
        return cos, sin

    def rotate(self, x: Tensor, state: Any) -> Tensor:
        cos, sin = (t.to(x.dtype) for t in state)
        rot, rest = x[..., : self.rotary_dim], x[..., self.rotary_dim :]
        if self.interleaved:
            pairs = rot.unflatten(-1, (-1, 2))  # (B, H, T, rotary_dim/2, 2)
            a, b = pairs[..., 0], pairs[..., 1]
            rotated = torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)
        else:
            a, b = rot.chunk(2, dim=-1)  # (B, H, T, rotary_dim/2) each
            rotated = torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)
        return torch.cat((rotated, rest), dim=-1) if rest.shape[-1] else rotated


def default_inv_freq(rotary_dim: int, theta: float) -> Tensor:
    return 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim))
