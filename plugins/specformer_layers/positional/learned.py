"""Learned absolute position embeddings (GPT-2)."""

from __future__ import annotations

from torch import Tensor, nn

from specformer.registry.params import FromParams, Params
from specformer.model.positional import PositionalScheme


class LearnedPositions(FromParams, PositionalScheme):
    """A trained vector per position, added to the token embeddings (GPT-2, Radford et al. 2019)."""

    #: One row per position up to context_length: nothing to add past it.
    extrapolates = "no"

    class Params(Params):
        pass

    def __init__(self, *, context_length: int, d_model: int) -> None:
        super().__init__()
        self.table = nn.Embedding(context_length, d_model)

    def embed(self, positions: Tensor) -> Tensor:
        # Padding carries position -1; its embedding is never attended to.
        return self.table(positions.clamp(min=0))

    def init_weights(self, *, std: float, residual_std: float) -> None:
        nn.init.normal_(self.table.weight, mean=0.0, std=std)
