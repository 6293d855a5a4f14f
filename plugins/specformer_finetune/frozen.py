"""Gradients through quantized base layers: the input's gradient from the dequantized weight.

The quant plugin's CPU kernels (``_weight_int8pack_mm``, the int4 pack kernel) have no
backward, so a quantized layer below a trained adapter would stop the gradient. A frozen
quantized layer keeps its fast kernel forward and computes only the input's gradient,
``grad_x = grad_y @ W`` with ``W`` dequantized for that product (the weight itself never
needs one). Its class is swapped in place, so its state dict is unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from specformer_quant import QuantizedLinear


class _InputGradOnly(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, layer: nn.Module) -> Tensor:  # type: ignore[override]
        ctx.layer = layer
        with torch.no_grad():
            return layer.forward_frozen(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        weight = ctx.layer.qweight.dequantize(grad.dtype)  # (out, in)
        return grad @ weight, None  # (..., in)


class FrozenQuantizedLinear(QuantizedLinear):
    """A quantized linear layer whose input gets a gradient (the weight stays frozen)."""

    def forward_frozen(self, x: Tensor) -> Tensor:
        return QuantizedLinear.forward(self, x)

    def forward(self, x: Tensor) -> Tensor:
        if torch.is_grad_enabled() and x.requires_grad:
            return _InputGradOnly.apply(x, self)
        return QuantizedLinear.forward(self, x)


def freeze_quantized(model: nn.Module) -> int:
    """Give every quantized linear layer of ``model`` an input gradient; return how many."""
    count = 0
    for module in model.modules():
        if type(module) is QuantizedLinear:
            module.__class__ = FrozenQuantizedLinear
            count += 1
    return count
