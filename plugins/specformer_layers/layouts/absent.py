"""A sublayer a block does without: Mamba-2's blocks have no feed-forward, Nemotron-H's have one of the two.

A block with ``mixer: none`` or ``ffn: none`` holds an :class:`Absent` there. It adds
nothing to the residual stream, and the block's norms that only serve it are not made (an
``nn.Identity`` stands in), so the block has exactly the weights of the sublayer it keeps.
As a mixer it keeps nothing between forwards and reads no positions.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from specformer.model.residual import ResidualConnection
from specformer_layers.layouts.params import AbsentParams


class Absent(nn.Module):
    """No sublayer (:class:`AbsentParams`): returns zeros, holds no weights, keeps no state."""

    Params = AbsentParams

    #: A sublayer that is not there: a layout makes no norm that serves only it (read by :func:`is_absent`).
    absent = True

    def __init__(self, params: AbsentParams | None = None, *, d_model: int, layer_index: int = 0) -> None:
        super().__init__()
        # Its one public fact as a mixer: the layer it stands in (no heads, so it keeps and reads nothing).
        self.layer_index = layer_index

    def forward(self, x: Tensor, ctx: Any = None) -> Tensor:
        return torch.zeros_like(x)

    def init_weights(self, *, std: float, residual_std: float) -> None:
        """Nothing to initialise."""


class Bypass(ResidualConnection):
    """The residual connection of an absent sublayer: the stream passes on unchanged (for any number of streams)."""

    def write(self, stream: Tensor, *outputs: Tensor, mix: Any = None) -> Tensor:
        return stream


def is_absent(module: Any) -> bool:
    """Whether a block's sublayer is not there (:class:`Absent`, or any module declaring ``absent = True``)."""
    return bool(getattr(module, "absent", False))


__all__ = ["Absent", "Bypass", "is_absent"]
