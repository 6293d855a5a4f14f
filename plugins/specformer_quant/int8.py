"""``int8``: symmetric per-output-channel int8 weights.

Two CPU kernels (measured on this project's CPU, docs/quantization.md):

- default: PyTorch's weight-only ``_weight_int8pack_mm`` with bfloat16 activations
  (about 2.5x faster than the float32 matmul at batch 1). Each row's result depends on
  that row alone, so batched rows equal rows run alone and speculative decoding's greedy
  output equals plain greedy decoding.
- ``dynamic_activations: true``: fbgemm's ``quantized::linear_dynamic``, which quantizes
  the activations of the whole call to 7 bits with one scale and multiplies in int8
  (about 5x faster). Faster, but one scale per call makes a row's result depend on the
  other rows and tokens in the same forward (batch, prompt length, speculative drafts).

Elsewhere (other devices, MoE expert stacks) the weight is dequantized for the matmul.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from pydantic import Field
from torch import Tensor

from specformer.params import Params
from specformer_quant.weights import QuantizedWeight, check_stored


class Int8Params(Params):
    dynamic_activations: bool = Field(default=False, description=(
        "fbgemm's int8 x int8 CPU kernel with one activation scale per call: about twice as fast, but a row's "
        "output then depends on the other rows and tokens in the forward"))


class Int8Weight(QuantizedWeight):
    def __init__(self, *, q: Tensor, scale: Tensor, dynamic_activations: bool = False) -> None:
        super().__init__()
        self.shape = tuple(q.shape)
        self.register_buffer("q", q)  # (..., N, K) int8
        self.register_buffer("scale", scale)  # (..., N) float32
        check_stored("weight", {"q": q, "scale": scale}, {"scale": self.shape[:-1]})
        self.dynamic_activations = dynamic_activations
        self._packed: Any = None

    @classmethod
    def from_float(cls, w: Tensor, *, dynamic_activations: bool = False) -> "Int8Weight":
        w = w.detach().float()
        scale = (w.abs().amax(dim=-1) / 127).clamp(min=1e-12)  # (..., N)
        q = (w / scale[..., None]).round().clamp(-127, 127).to(torch.int8)
        return cls(q=q, scale=scale, dynamic_activations=dynamic_activations)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:
        return (self.q.float() * self.scale[..., None]).to(dtype)

    def matmul(self, x: Tensor) -> Tensor:
        if self.dynamic_activations and x.device.type == "cpu" and x.dtype == torch.float32 and len(self.shape) == 2:
            if self._packed is None:
                self._packed = _prepack(self.q, self.scale)
            # reduce_range: 7-bit activations, so that fbgemm's int16 pair sums cannot saturate on CPUs without VNNI
            return torch.ops.quantized.linear_dynamic(x, self._packed, True)
        if x.device.type == "cpu" and len(self.shape) == 2 and hasattr(torch, "_weight_int8pack_mm"):
            if self._packed is None:
                self._packed = self.scale.to(torch.bfloat16)
            flat = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)  # (M, K)
            y = torch._weight_int8pack_mm(flat, self.q, self._packed)  # (M, N)
            return y.to(x.dtype).view(*x.shape[:-1], self.shape[0])
        return super().matmul(x)

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        self._packed = None  # moved or cast: pack again from the buffers
        return super()._apply(fn, recurse)


def _prepack(q: Tensor, scale: Tensor) -> Any:
    with warnings.catch_warnings():  # torch.ao's quantized tensors warn of deprecation; the kernel is what we use
        warnings.simplefilter("ignore")
        zeros = torch.zeros(q.shape[0], dtype=torch.long)
        weight = torch._make_per_channel_quantized_tensor(q.cpu(), scale.double().cpu(), zeros, 0)
        return torch.ops.quantized.linear_prepack(weight, None)


class Int8:
    """Symmetric per-output-channel int8 weights (half of bf16, a quarter of float32); on CPU a weight-only
    int8 kernel, or fbgemm's int8 x int8 one with dynamic_activations (faster, rows then depend on each other)."""

    name = "int8"
    Params = Int8Params

    #: The stored buffer whose shape gives the weight's shape (see :meth:`shape_from_stored`).
    primary = "q"

    def __init__(self, params: Int8Params) -> None:
        self.params = params

    @staticmethod
    def shape_from_stored(shape: tuple[int, ...]) -> tuple[int, ...]:
        """The float weight's shape from the stored ``q`` buffer's."""
        return tuple(shape)

    @classmethod
    def from_params(cls, params: Int8Params) -> "Int8":
        return cls(params)

    def quantize(self, w: Tensor) -> Int8Weight:
        return Int8Weight.from_float(w, dynamic_activations=self.params.dynamic_activations)

    def empty(self, shape: tuple[int, ...]) -> Int8Weight:
        """A weight of this shape to load stored buffers into."""
        return Int8Weight(q=torch.zeros(shape, dtype=torch.int8), scale=torch.ones(shape[:-1]),
                          dynamic_activations=self.params.dynamic_activations)
