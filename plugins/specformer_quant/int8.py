"""``int8``: symmetric per-output-channel int8 weights.

CPU kernels (measured on this project's CPU by ``benchmarks/bench_quant_kernels.py``,
docs/quantization.md):

- default, float32 activations: fbgemm's int8 x int8 ``quantized::linear_dynamic`` with
  *per-row* activation scales. fbgemm quantizes its whole input with one scale taken
  from the input's range; each row is divided by its own max |x| first and a guard row
  ``[1, -1, 0, ...]`` is appended, so the call's range is always [-1, 1], the
  quantization of a row depends on that row alone, and the result is scaled back per
  row. Batched rows then equal rows run alone, bit for bit, and speculative decoding's
  greedy output equals plain greedy decoding.
- other activation dtypes (bfloat16): PyTorch's weight-only ``_weight_int8pack_mm``.
- ``dynamic_activations: true``: fbgemm's kernel as it is, one activation scale for the
  whole call (no rescaling, no guard row: a little faster at several rows, but a row's
  result depends on the other rows and tokens in the same forward).

Elsewhere (other devices, MoE expert stacks) the weight is dequantized for the matmul.
"""

from __future__ import annotations

import functools
import threading
import warnings
from typing import Any

import torch
from torch import Tensor

from specformer_quant.params import Int8Params
from specformer_quant.weights import QuantizedWeight, check_stored


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
        if x.device.type == "cpu" and x.dtype == torch.float32 and len(self.shape) == 2 and self.shape[1] >= 2 \
                and _has_fbgemm():
            if self._packed is None:
                guard = torch.zeros(1, self.shape[1])  # pins a call's range to [-1, 1] whatever its rows hold
                guard[0, 0], guard[0, 1] = 1.0, -1.0
                self._packed = _prepack(self.q, self.scale), guard
            packed, guard = self._packed
            if self.dynamic_activations:
                # reduce_range: 7-bit activations, so that fbgemm's int16 pair sums cannot saturate on CPUs without VNNI
                return torch.ops.quantized.linear_dynamic(x, packed, True)
            return _per_row(x, packed, guard, self.shape[0])
        if x.device.type == "cpu" and len(self.shape) == 2 and hasattr(torch, "_weight_int8pack_mm"):
            flat = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)  # (M, K)
            y = torch._weight_int8pack_mm(flat, self.q, self.scale.to(torch.bfloat16))  # (M, N)
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


#: Calls of at most this many rows (decode steps, speculative verification) reuse a scratch buffer.
SCRATCH_ROWS = 16

# Per thread (a server may decode on several): (rows, K) -> ((rows + 1, K) buffer whose last row is the
# guard, its first ``rows`` rows). Saves the concatenation and its allocation on every decode-step matmul.
_scratch = threading.local()


def _per_row(x: Tensor, packed: Any, guard: Tensor, n_out: int) -> Tensor:
    """fbgemm's dynamic int8 matmul with one activation scale per row (see the module docstring)."""
    flat = x.reshape(-1, x.shape[-1])  # (M, K)
    rows = flat.shape[0]
    row_max = torch.linalg.vector_norm(flat, ord=float("inf"), dim=-1, keepdim=True)  # (M, 1): max |x| of each row
    row_max.clamp_(min=torch.finfo(torch.float32).tiny)  # an all-zero row stays zero instead of 0 / 0
    if rows <= SCRATCH_ROWS and not (flat.requires_grad and torch.is_grad_enabled()):  # out= has no autograd
        scaled, head = _scratch_for(rows, guard)
        torch.div(flat, row_max, out=head)  # (M + 1, K): the scaled rows, then the guard row
    else:
        scaled = torch.cat((flat / row_max, guard))
    # reduce_range: 7-bit activations, so that fbgemm's int16 pair sums cannot saturate on CPUs without VNNI
    y = torch.ops.quantized.linear_dynamic(scaled, packed, True)  # (M + 1, N)
    return y[:rows].mul_(row_max).view(*x.shape[:-1], n_out)


def _scratch_for(rows: int, guard: Tensor) -> tuple[Tensor, Tensor]:
    """This thread's ``(rows + 1, K)`` input buffer (guard row last) and a view of its first ``rows`` rows."""
    buffers = getattr(_scratch, "buffers", None)
    if buffers is None:
        buffers = _scratch.buffers = {}
    key = (rows, guard.shape[1])
    if key not in buffers:
        with torch.inference_mode(False):  # a normal tensor: writable inside and outside inference mode
            buffer = torch.cat((torch.zeros(rows, guard.shape[1]), guard))
        buffers[key] = (buffer, buffer[:rows])
    return buffers[key]


@functools.cache
def _has_fbgemm() -> bool:
    return "fbgemm" in torch.backends.quantized.supported_engines or "x86" in torch.backends.quantized.supported_engines


class Int8:
    """Symmetric per-output-channel int8 weights (half of bf16, a quarter of float32); on CPU fbgemm's
    int8 x int8 kernel with per-row activation scales (per-call with dynamic_activations: rows then depend
    on each other)."""

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

    def quantize(self, w: Tensor) -> Int8Weight:
        return Int8Weight.from_float(w, dynamic_activations=self.params.dynamic_activations)

    def empty(self, shape: tuple[int, ...]) -> Int8Weight:
        """A weight of this shape to load stored buffers into."""
        return Int8Weight(q=torch.zeros(shape, dtype=torch.int8), scale=torch.ones(shape[:-1]),
                          dynamic_activations=self.params.dynamic_activations)
