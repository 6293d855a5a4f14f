"""``bf16``: weights stored and multiplied in bfloat16 (half the bytes of float32, 8 exponent bits)."""

from __future__ import annotations

import torch
from torch import Tensor

from specformer_quant.params import Bf16Params
from specformer_quant.weights import QuantizedWeight


class Bf16Weight(QuantizedWeight):
    def __init__(self, *, value: Tensor) -> None:
        super().__init__()
        self.shape = tuple(value.shape)
        self.register_buffer("value", value.to(torch.bfloat16))

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:
        return self.value.to(dtype)

    def matmul(self, x: Tensor) -> Tensor:
        return torch.nn.functional.linear(x.to(torch.bfloat16), self.value).to(x.dtype)


class Bf16:
    """Weights stored and multiplied in bfloat16: half the bytes of float32, float32's exponent range."""

    name = "bf16"
    Params = Bf16Params

    #: The stored buffer whose shape gives the weight's shape (see :meth:`shape_from_stored`).
    primary = "value"

    def __init__(self, params: Bf16Params) -> None:
        self.params = params

    @staticmethod
    def shape_from_stored(shape: tuple[int, ...]) -> tuple[int, ...]:
        """The float weight's shape from the stored ``value`` buffer's."""
        return tuple(shape)

    def quantize(self, w: Tensor) -> Bf16Weight:
        return Bf16Weight(value=w.detach())

    def empty(self, shape: tuple[int, ...]) -> Bf16Weight:
        return Bf16Weight(value=torch.zeros(shape))
