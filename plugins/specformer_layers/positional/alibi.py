"""Attention with linear biases, ALiBi (Press et al. 2022)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from specformer.model.positional import PositionalScheme
from specformer_layers.positional.fp32 import Float32Tables
from specformer_layers.positional.params import ALiBiParams


class ALiBi(PositionalScheme, Float32Tables):
    """Linear biases on the attention scores, one slope per head: :class:`ALiBiParams`."""

    Params = ALiBiParams

    def __init__(self, params: ALiBiParams | None = None, *, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.register_table("slopes", torch.tensor(alibi_slopes(n_heads), dtype=torch.float32, device="cpu"))

    def attention_bias(self, q_positions: Tensor, k_positions: Tensor, state: Any) -> Tensor:
        distance = q_positions[:, None, :, None] - k_positions[:, None, None, :]  # (B, 1, Tq, Tk)
        return -self.slopes[None, :, None, None] * distance.float()  # (B, H, Tq, Tk), float32

    def score_bias(self, q_position: Tensor, k_position: Tensor, head: Tensor, state: Any) -> Tensor:
        """The same bias for single scores (FlexAttention's score_mod): elementwise, no (Tq, Tk) tensor."""
        return -self.slopes[head] * (q_position - k_position).float()

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}"


def alibi_slopes(n_heads: int) -> list[float]:
    """The per-head slopes of ALiBi for ``n_heads`` heads."""
    ALiBiParams().sized(n_heads=n_heads)  # at least one head

    def geometric(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    lower = 2 ** math.floor(math.log2(n_heads))
    if lower == n_heads:
        return geometric(n_heads)
    return geometric(lower) + geometric(2 * lower)[0::2][: n_heads - lower]
