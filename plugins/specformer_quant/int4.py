"""``int4``: asymmetric group-wise 4-bit weights (group size 32, 64 or 128 along the input).

Each group of ``group_size`` inputs of an output row has a scale and a minimum; values
are ``q * scale + minimum`` with ``q`` in 0..15, two per byte. On CPU a matrix whose
shapes the kernel takes runs PyTorch's ``_weight_int4pack_mm_for_cpu`` (bfloat16
activations, float32 accumulate); otherwise the weight is dequantized for the matmul.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from specformer_quant.params import Int4Params
from specformer_quant.weights import QuantizedWeight, check_stored


class Int4Weight(QuantizedWeight):
    def __init__(self, *, packed: Tensor, scale: Tensor, minimum: Tensor, group_size: int) -> None:
        super().__init__()
        *lead, n, half = packed.shape
        self.shape = (*lead, n, 2 * half)
        self.group_size = group_size
        groups = self.shape[-1] // group_size
        self.register_buffer("packed", packed)  # (..., N, K/2) uint8: low nibble = even input
        self.register_buffer("scale", scale)  # (..., N, K/g) float32
        self.register_buffer("minimum", minimum)  # (..., N, K/g) float32
        expected = (*lead, n, groups)
        check_stored("weight", {"scale": scale, "minimum": minimum}, {"scale": expected, "minimum": expected})
        self._kernel: Any = None

    @classmethod
    def from_float(cls, w: Tensor, *, group_size: int) -> "Int4Weight":
        w = w.detach().float()
        *lead, n, k = w.shape
        if k % group_size:
            raise ValueError(f"int4 with group_size {group_size} needs the input width ({k}) to be a multiple of it")
        groups = w.reshape(*lead, n, k // group_size, group_size)  # (..., N, K/g, g)
        low, high = groups.amin(dim=-1), groups.amax(dim=-1)
        scale = ((high - low) / 15).clamp(min=1e-12)
        q = ((groups - low[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.uint8).reshape(*lead, n, k)
        packed = q[..., 0::2] | (q[..., 1::2] << 4)  # (..., N, K/2)
        return cls(packed=packed, scale=scale, minimum=low, group_size=group_size)

    def codes(self) -> Tensor:
        """The 4-bit values ``(..., N, K)`` as uint8."""
        return torch.stack((self.packed & 15, self.packed >> 4), dim=-1).flatten(-2)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:
        *lead, n, k = self.shape
        q = self.codes().float().reshape(*lead, n, k // self.group_size, self.group_size)
        return (q * self.scale[..., None] + self.minimum[..., None]).reshape(self.shape).to(dtype)

    def matmul(self, x: Tensor) -> Tensor:
        if x.device.type == "cpu" and len(self.shape) == 2:
            if self._kernel is None:
                self._kernel = _cpu_kernel(self) or False
            if self._kernel:
                packed, scales_and_zeros = self._kernel
                flat = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)  # (M, K)
                y = torch._weight_int4pack_mm_for_cpu(flat, packed, self.group_size, scales_and_zeros)
                return y.to(x.dtype).view(*x.shape[:-1], self.shape[0])
        return super().matmul(x)

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        self._kernel = None
        return super()._apply(fn, recurse)


def _cpu_kernel(weight: Int4Weight) -> tuple[Tensor, Tensor] | None:
    """The weight in the layout of PyTorch's int4 CPU kernel, or None where the kernel is missing or refuses it."""
    if not hasattr(torch, "_weight_int4pack_mm_for_cpu"):
        return None
    n, k = weight.shape
    try:
        codes = weight.codes().to(torch.int32)  # (N, K)
        packed = torch._convert_weight_to_int4pack_for_cpu(codes, 2)
        # The kernel computes (q - 8) * scale + zero: our minimum is that zero minus 8 scales.
        zeros = weight.minimum + 8 * weight.scale  # (N, K/g)
        scales_and_zeros = torch.stack((weight.scale, zeros), dim=-1).transpose(0, 1).contiguous()  # (K/g, N, 2)
        scales_and_zeros = scales_and_zeros.to(torch.bfloat16)
        probe = torch.zeros(1, k, dtype=torch.bfloat16)
        torch._weight_int4pack_mm_for_cpu(probe, packed, weight.group_size, scales_and_zeros)
        return packed, scales_and_zeros
    except (RuntimeError, NotImplementedError):
        return None


class Int4:
    """Asymmetric group-wise 4-bit weights (a scale and a minimum per group of inputs, two weights a byte);
    on CPU PyTorch's int4-pack kernel with bfloat16 activations."""

    name = "int4"
    Params = Int4Params

    #: The stored buffer whose shape gives the weight's shape (see :meth:`shape_from_stored`).
    primary = "packed"

    def __init__(self, params: Int4Params) -> None:
        self.params = params

    @staticmethod
    def shape_from_stored(shape: tuple[int, ...]) -> tuple[int, ...]:
        """The float weight's shape from the stored ``packed`` buffer's."""
        return tuple((*shape[:-1], 2 * shape[-1]))

    def quantize(self, w: Tensor) -> Int4Weight:
        return Int4Weight.from_float(w, group_size=self.params.group_size)

    def empty(self, shape: tuple[int, ...]) -> Int4Weight:
        *lead, n, k = shape
        if k % self.params.group_size:
            raise ValueError(f"int4 with group_size {self.params.group_size} needs the input width ({k}) to be a "
                             f"multiple of it")
        groups = (*lead, n, k // self.params.group_size)
        return Int4Weight(packed=torch.zeros((*lead, n, k // 2), dtype=torch.uint8), scale=torch.ones(groups),
                          minimum=torch.zeros(groups), group_size=self.params.group_size)
