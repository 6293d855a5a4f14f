"""Quantized weights: the stored form of one matrix, or a stack of them (MoE experts).

A scheme turns a float weight ``(..., N, K)`` (``nn.Linear`` layout: N outputs, K inputs)
into a :class:`QuantizedWeight`, a module whose buffers are what a checkpoint stores and
whose ``dequantize()`` gives the float weight back. :class:`QuantizedLinear` replaces an
``nn.Linear``; a stack of expert weights is replaced by the QuantizedWeight itself, which
``experts_in[e]`` indexes like the parameter it replaces.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn


class QuantizedWeight(nn.Module):
    """Base of every scheme's stored weight; subclasses hold buffers and implement ``dequantize``."""

    #: The logical float shape (..., N, K).
    shape: tuple[int, ...]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:
        raise NotImplementedError

    def matmul(self, x: Tensor) -> Tensor:
        """``x @ W.T`` for ``x`` ``(..., K)``; schemes override it with a fast kernel where there is one."""
        return nn.functional.linear(x, self.dequantize(x.dtype))

    def __getitem__(self, index: int) -> Tensor:
        """Expert ``index`` of a stack, dequantized ``(N, K)`` (what ``experts_in[e]`` gave as a parameter)."""
        return self.dequantize()[index]

    def numel(self) -> int:  # what the replaced parameter reported (active-parameter counts read it)
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers())

    def extra_repr(self) -> str:
        return f"shape={tuple(self.shape)}"


class QuantizedLinear(nn.Module):
    """An ``nn.Linear`` whose weight is a :class:`QuantizedWeight`; the bias stays float."""

    def __init__(self, *, weight: QuantizedWeight, bias: Tensor | None) -> None:
        super().__init__()
        self.qweight = weight
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.out_features, self.in_features = weight.shape

    def forward(self, x: Tensor) -> Tensor:
        y = self.qweight.matmul(x)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    @property
    def weight(self) -> Tensor:
        """The dequantized weight (code that reads ``.weight`` still gets a float matrix)."""
        return self.qweight.dequantize()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def check_stored(name: str, buffers: dict[str, Any], expected: dict[str, tuple[int, ...]]) -> None:
    """ValueError naming the first stored tensor whose shape does not fit the weight's."""
    for key, shape in expected.items():
        got = tuple(buffers[key].shape)
        if got != shape:
            raise ValueError(f"{name}.{key}: stored shape {got} does not fit the quantized weight (expected {shape})")
