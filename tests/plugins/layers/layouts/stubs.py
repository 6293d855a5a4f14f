"""Sublayers and norms whose outputs are easy to write down, to check how a layout wires them."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class Affine(nn.Module):
    """A stand-in norm: ``x * scale + shift`` (distinct per instance)."""

    def __init__(self, scale: float, shift: float) -> None:
        super().__init__()
        self.scale, self.shift = scale, shift

    def forward(self, x: Tensor) -> Tensor:
        return x * self.scale + self.shift


class StubAttention(nn.Module):
    """A stand-in attention: a fixed non-linear map that takes the context argument."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d, d, dtype=torch.float64))

    def forward(self, x: Tensor, ctx: object) -> Tensor:
        return torch.tanh(x @ self.weight)


class StubFFN(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d, d, dtype=torch.float64))

    def forward(self, x: Tensor) -> Tensor:
        return torch.sin(x @ self.weight)


def norm_maker():
    """A make_norm that hands out norms 1, 2, 3, ... each with its own scale and shift."""
    made: list[Affine] = []

    def make_norm(*, dim: int = 0) -> Affine:
        made.append(Affine(scale=1.0 + len(made), shift=0.1 * (len(made) + 1)))
        return made[-1]

    return make_norm


D = 8
