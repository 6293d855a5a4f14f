"""The gated RMSNorm on a recurrent mixer's per-head output: ``rmsnorm(o) * weight * act(gate)``.

Gated DeltaNet (SiLU gate) and Kimi Delta Attention (sigmoid gate) normalise each head's
output over its channels, then let a gate projected from the layer's input scale it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_GATES = {"silu": F.silu, "sigmoid": torch.sigmoid}


class GatedRMSNorm(nn.Module):
    """``rmsnorm(x) * weight * activation(gate)`` over the last ``dim`` channels, computed in float32 (or float64).

    ``weight`` ``(dim,)`` starts at ones. The result comes back in ``x``'s dtype.
    """

    def __init__(self, dim: int, *, eps: float, activation: str = "silu") -> None:
        super().__init__()
        if activation not in _GATES:
            raise ValueError(f"GatedRMSNorm's activation must be one of {', '.join(_GATES)}, got {activation!r}")
        self.dim = dim
        self.eps = eps
        self.activation = activation
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor, gate: Tensor) -> Tensor:
        dtype = torch.promote_types(x.dtype, torch.float32)
        normed = F.rms_norm(x.to(dtype), (self.dim,), None, self.eps)
        return (normed * self.weight.to(dtype) * _GATES[self.activation](gate.to(dtype))).to(x.dtype)

    def init_weights(self, *, std: float, residual_std: float) -> None:
        nn.init.ones_(self.weight)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, eps={self.eps}, activation={self.activation}"


__all__ = ["GatedRMSNorm"]
