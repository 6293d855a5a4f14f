"""Differential attention's pairing of heads, its learned lambda and its per-head norm (``attention`` ``differential``).

Differential Transformer (Ye et al. 2024, arXiv:2410.05258), in the arrangement of
transformers' DiffLlama: the ``H`` query heads are ``H / 2`` pairs, head ``i`` paired with
head ``i + H/2`` (and key head ``g`` with ``g + KV/2``), each pair reading a value of
``2 * head_dim`` channels: value heads ``g`` and ``g + KV/2`` side by side. A pair's output
is ``(softmax_1 - lambda * softmax_2) V``, normalised over its ``2 * head_dim`` channels and
scaled by ``1 - lambda_init``, where
``lambda = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init`` and
``lambda_init = 0.8 - 0.6 exp(-0.3 * layer_index)`` (layers counted from 0).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

#: transformers' DiffLlama initialises the four lambda vectors from N(0, 0.1) (its lambda_std_dev default; the paper's).
LAMBDA_STD = 0.1


def lambda_init(layer_index: int) -> float:
    """The depth-dependent constant of lambda: ``0.8 - 0.6 exp(-0.3 * layer_index)``, layers counted from 0."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer_index)


class DifferentialHeads(nn.Module):
    """Splits values into the two halves the paired heads read, and combines the heads' outputs into pairs.

    The cache keeps keys and values as plain attention does; the pairing happens on what attention
    returns, so cached decoding, padding and every kernel work unchanged.
    """

    def __init__(self, *, head_dim: int, layer_index: int, norm: nn.Module) -> None:
        super().__init__()
        self.lambda_init = lambda_init(layer_index)
        self.lambda_q1 = nn.Parameter(torch.zeros(head_dim))
        self.lambda_k1 = nn.Parameter(torch.zeros(head_dim))
        self.lambda_q2 = nn.Parameter(torch.zeros(head_dim))
        self.lambda_k2 = nn.Parameter(torch.zeros(head_dim))
        self.norm = norm  # over a pair's 2 * head_dim channels

    @staticmethod
    def value_halves(v: Tensor) -> tuple[Tensor, Tensor]:
        """``v`` (B, KV, S, hd) -> the first and second channels of every pair's value, each (B, KV, S, hd).

        Key head ``g`` (and its query group) reads value heads ``g mod KV/2`` and ``g mod KV/2 + KV/2``: the
        second half of the key heads belongs to the same pairs as the first, so both halves are repeated.
        """
        low, high = v.chunk(2, dim=1)  # (B, KV/2, S, hd) each
        return low.repeat(1, 2, 1, 1), high.repeat(1, 2, 1, 1)  # (B, KV, S, hd) each

    def lambda_full(self, dtype: torch.dtype) -> Tensor:
        """The scalar lambda, its dot products taken in float32 at least (as transformers does), in ``dtype``."""
        wide = torch.promote_types(self.lambda_q1.dtype, torch.float32)
        first = torch.exp((self.lambda_q1.to(wide) * self.lambda_k1.to(wide)).sum()).to(dtype)
        second = torch.exp((self.lambda_q2.to(wide) * self.lambda_k2.to(wide)).sum()).to(dtype)
        return first - second + self.lambda_init

    def forward(self, y: Tensor) -> Tensor:
        """``y`` (B, H, T, 2hd), every head's output over both value halves -> (B, H/2, T, 2hd), one per pair."""
        first, second = y.chunk(2, dim=1)  # heads i and i + H/2: (B, H/2, T, 2hd) each
        paired = first - self.lambda_full(y.dtype) * second
        return (1 - self.lambda_init) * self.norm(paired)

    def init_weights(self, *, std: float, residual_std: float) -> None:
        # The paper's fixed spread, not the model's std: lambda's scale is set by lambda_init, not by the width.
        for vector in (self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2):
            nn.init.normal_(vector, std=LAMBDA_STD)

    def extra_repr(self) -> str:
        return f"lambda_init={self.lambda_init:.4f}"
