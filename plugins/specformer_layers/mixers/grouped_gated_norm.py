"""The RMSNorm inside Mamba-2's output: per group of channels, gated by the layer's ``z`` branch."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class GroupedGatedRMSNorm(nn.Module):
    """RMSNorm over each of ``groups`` equal slices of ``dim`` channels, with the gate ``silu(z)``.

    ``norm_before_gate``: ``weight * rms(y) * silu(z)``; otherwise ``weight * rms(y * silu(z))``
    (Mamba-2). Normalising per group keeps a group's channels independent of the others',
    so tensor-parallel shards (one group each) normalise alone. Computed in float32 at least.
    """

    def __init__(self, dim: int, *, groups: int, eps: float, norm_before_gate: bool) -> None:
        super().__init__()
        if dim % groups:
            raise ValueError(f"the gated norm's {dim} channels do not split into {groups} groups")
        self.weight = nn.Parameter(torch.ones(dim))
        self.groups = groups
        self.eps = eps
        self.norm_before_gate = norm_before_gate

    def forward(self, y: Tensor, z: Tensor) -> Tensor:
        dtype = y.dtype
        work = torch.promote_types(dtype, torch.float32)
        y, gate = y.to(work), F.silu(z.to(work))
        if not self.norm_before_gate:
            y = y * gate
        grouped = y.view(*y.shape[:-1], self.groups, -1)  # (..., G, dim / G)
        grouped = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + self.eps)
        y = grouped.view(y.shape)
        if self.norm_before_gate:
            y = y * gate
        return (self.weight.to(work) * y).to(dtype)

    def extra_repr(self) -> str:
        return (f"{self.weight.shape[0]}, groups={self.groups}, eps={self.eps}, "
                f"norm_before_gate={self.norm_before_gate}")


__all__ = ["GroupedGatedRMSNorm"]
