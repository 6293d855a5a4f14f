"""Per-layer embeddings: a token table and a projection of the embedding, one slice per layer (Gemma 3n, Gemma 4)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from specformer_layers.per_layer.params import PerLayerEmbeddingParams


class PerLayerEmbedding(nn.Module):
    """What :class:`PerLayerEmbeddingParams` computes: ``(B, T, n_layers, width)`` from the tokens and their embeddings."""

    Params = PerLayerEmbeddingParams

    def __init__(self, params: PerLayerEmbeddingParams, *, vocab_size: int, d_model: int, n_layers: int) -> None:
        super().__init__()
        self.width = params.width  # the public fact the builder sizes each block's per-layer input by
        self.n_layers = n_layers
        self.table = nn.Embedding(params.vocab_size or vocab_size, n_layers * params.width)
        self.projection = nn.Linear(d_model, n_layers * params.width, bias=False)
        self.norm = params.norm.make(dim=params.width)
        self.projection_scale = d_model**-0.5
        self.table_scale = math.sqrt(params.width)

    def forward(self, input_ids: Tensor, embeddings: Tensor) -> Tensor:
        B, T = input_ids.shape
        L, P = self.n_layers, self.width
        # Gemma scales the table rows in the weights' dtype, as it does the main embedding.
        tokens = self.table(input_ids) * torch.tensor(self.table_scale, dtype=self.table.weight.dtype)
        projected = self.projection(embeddings) * self.projection_scale
        projected = self.norm(projected.view(B, T, L, P))  # (B, T, L, P)
        return (projected + tokens.view(B, T, L, P)) * 2**-0.5

    def init_weights(self, *, std: float, residual_std: float) -> None:
        nn.init.normal_(self.table.weight, std=std)
        nn.init.normal_(self.projection.weight, std=std)

    def extra_repr(self) -> str:
        return f"n_layers={self.n_layers}, width={self.width}"
