"""Temperature: sharpen or flatten the next-token distribution."""

from __future__ import annotations

import math

import torch
from pydantic import Field
from torch import Tensor

from specformer.registry.params import Params


class Temperature:
    """Divide the logits by ``value``: ``softmax(z / T)``.

    ``T < 1`` concentrates probability on the likeliest tokens, ``T > 1`` spreads it out.
    A temperature of 0 is not a distribution; use ``greedy`` for argmax decoding. ``T``
    must be finite: an infinite temperature would turn a filtered token's ``-inf`` into
    NaN. Filtered tokens stay ``-inf``, and a very small ``T`` saturates at the largest
    finite logit instead of overflowing (the limit ``T -> 0`` is argmax, ties aside).
    """

    class Params(Params):
        value: float = Field(gt=0, allow_inf_nan=False,
                             description="The temperature T > 0, finite; logits become logits / T. Use greedy for T -> 0.")

    def __init__(self, *, value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
            raise ValueError(f"temperature must be a finite number > 0, got {value!r}; "
                             f"use the greedy sampler for argmax decoding")
        self.value = float(value)

    @classmethod
    def from_params(cls, params: Params) -> "Temperature":
        return cls(value=params.value)

    def __call__(self, logits: Tensor, input_ids: Tensor) -> Tensor:
        largest = torch.finfo(logits.dtype).max
        scaled = (logits / self.value).clamp(-largest, largest)  # +-inf from overflow would make NaN later
        return torch.where(torch.isneginf(logits), logits, scaled)  # filtered stays filtered

    def __repr__(self) -> str:
        return f"temperature(value={self.value})"
