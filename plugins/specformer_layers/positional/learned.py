"""Learned absolute position embeddings (GPT-2)."""

from __future__ import annotations

from torch import Tensor, nn

from specformer.model.positional import PositionalScheme
from specformer_layers.positional.params import LearnedPositionsParams


class LearnedPositions(PositionalScheme):
    """Learned absolute positions, one row per position up to ``context_length``: :class:`LearnedPositionsParams`."""

    #: One row per position up to context_length: nothing to add past it.
    extrapolates = "no"

    Params = LearnedPositionsParams

    def __init__(self, params: LearnedPositionsParams | None = None, *, context_length: int, d_model: int) -> None:
        super().__init__()
        self.offset = params.offset if params is not None else 0
        self.table = nn.Embedding(context_length + self.offset, d_model)

    def embed(self, positions: Tensor) -> Tensor:
        # Padding carries position -1; its embedding is never attended to.
        return self.table(positions.clamp(min=0) + self.offset)

    def init_weights(self, *, std: float, residual_std: float) -> None:
        nn.init.normal_(self.table.weight, mean=0.0, std=std)
