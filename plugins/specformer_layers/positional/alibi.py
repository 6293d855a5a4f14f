"""Attention with linear biases, ALiBi (Press et al. 2022)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from specformer.registry.params import FromParams, Params
from specformer.model.positional import PositionalScheme
from specformer_layers.positional.fp32 import Float32Tables


class ALiBi(FromParams, PositionalScheme, Float32Tables):
    """No position embedding; each head penalises a score by ``slope * distance`` to the key.

    The score of query position ``i`` and key position ``j`` gets ``-m_h * (i - j)``, with
    head slopes ``m_h`` a geometric sequence ``2^(-8/n), 2^(-16/n), ...`` for ``n`` heads
    (a power of two) and, for other head counts, the slopes of the nearest lower power of
    two followed by every other slope of the next power, as in the paper's code. The bias
    is computed from absolute query and key positions, so it works with a KV cache (key
    positions come from the cache) and with SDPA (as an additive float mask).
    """

    class Params(Params):
        pass

    def __init__(self, *, n_heads: int) -> None:
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
    if n_heads < 1:
        raise ValueError(f"ALiBi needs at least one head, got n_heads={n_heads}")

    def geometric(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    lower = 2 ** math.floor(math.log2(n_heads))
    if lower == n_heads:
        return geometric(n_heads)
    return geometric(lower) + geometric(2 * lower)[0::2][: n_heads - lower]
