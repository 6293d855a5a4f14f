"""T5-style bucketed relative position bias (Raffel et al. 2020): a learned score bias per head and distance bucket."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from specformer.model.parallel_plan import ParallelPlan
from specformer.model.positional import PositionalScheme
from specformer_layers.positional.relative_bias_params import RelativeBiasParams


class RelativeBias(PositionalScheme):
    """A ``(n_buckets, n_heads)`` table of score biases, looked up by the bucket of ``k - q``: :class:`RelativeBiasParams`."""

    Params = RelativeBiasParams

    def __init__(self, params: RelativeBiasParams | None = None, *, n_heads: int) -> None:
        super().__init__()
        params = params if params is not None else RelativeBiasParams()
        params.sized(n_heads=n_heads)  # at least one head
        self.n_heads = n_heads
        self.n_buckets, self.max_distance, self.bidirectional = params.n_buckets, params.max_distance, params.bidirectional
        self.table = nn.Parameter(torch.zeros(self.n_buckets, n_heads))

    def attention_bias(self, q_positions: Tensor, k_positions: Tensor, state: Any) -> Tensor:
        distance = k_positions[:, None, :] - q_positions[:, :, None]  # (B, Tq, Tk): key minus query, as T5
        buckets = relative_buckets(distance, n_buckets=self.n_buckets, max_distance=self.max_distance,
                                   bidirectional=self.bidirectional)
        bias = self.table[buckets]  # (B, Tq, Tk, H)
        return bias.permute(0, 3, 1, 2).float()  # (B, H, Tq, Tk); a padding key (-1) is masked by the kernels

    def score_bias(self, q_position: Tensor, k_position: Tensor, head: Tensor, state: Any) -> Tensor:
        """The same bias for single scores (FlexAttention's score_mod): elementwise, no (Tq, Tk) tensor."""
        bucket = relative_buckets(k_position - q_position, n_buckets=self.n_buckets, max_distance=self.max_distance,
                                  bidirectional=self.bidirectional)
        return self.table[bucket, head].float()

    def parallel_plan(self) -> ParallelPlan:
        """Kept whole on every device: the attention kernels refuse a bias whose heads are not the layer's
        (tensor parallelism splits the heads of attention, not of the model's positional scheme)."""
        return {"table": ()}

    def init_weights(self, *, std: float, residual_std: float) -> None:
        nn.init.normal_(self.table, mean=0.0, std=std)

    def extra_repr(self) -> str:
        return (f"n_buckets={self.n_buckets}, max_distance={self.max_distance}, bidirectional={self.bidirectional}, "
                f"n_heads={self.n_heads}")


def relative_buckets(distance: Tensor, *, n_buckets: int, max_distance: int, bidirectional: bool) -> Tensor:
    """The bucket (long) of each key-minus-query ``distance``, as :class:`RelativeBiasParams` defines it.

    The logarithm is taken in float32 and the result truncated, as T5's and CPM-Ant's code do, so that
    checkpoints trained with them see the same buckets at the boundaries.
    """
    side = n_buckets // 2 if bidirectional else n_buckets
    if bidirectional:
        offset = (distance > 0).long() * side  # keys after the query: the upper half
        n = distance.abs()
    else:
        offset = torch.zeros_like(distance)
        n = (-distance).clamp(min=0)  # keys after the query (masked anyway) share bucket 0
    exact = side // 2
    # clamp: log(0) would be -inf (its bucket is chosen from the exact branch anyway)
    scaled = torch.log(n.clamp(min=1).float() / exact) / math.log(max_distance / exact) * (side - exact)
    far = (exact + scaled.long()).clamp(max=side - 1)
    return offset + torch.where(n < exact, n, far)
