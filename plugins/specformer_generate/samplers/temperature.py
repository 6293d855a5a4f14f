"""Temperature: sharpen or flatten the next-token distribution."""

from __future__ import annotations

from pydantic import Field
from torch import Tensor

from specformer.params import Params


class Temperature:
    """Divide the logits by ``value``: ``softmax(z / T)``.

    ``T < 1`` concentrates probability on the likeliest tokens, ``T > 1`` spreads it out.
    A temperature of 0 is not a distribution; use ``greedy`` for argmax decoding.
    """

    class Params(Params):
        value: float = Field(gt=0, description="The temperature T > 0; logits become logits / T. Use greedy for T -> 0.")

    def __init__(self, *, value: float) -> None:
        if not value > 0:
            raise ValueError(f"temperature must be > 0, got {value}; use the greedy sampler for argmax decoding")
        self.value = float(value)

    @classmethod
    def from_params(cls, params: Params) -> "Temperature":
        return cls(value=params.value)

    def __call__(self, logits: Tensor, input_ids: Tensor) -> Tensor:
        return logits / self.value

    def __repr__(self) -> str:
        return f"temperature(value={self.value})"
