"""Blocks that normalise each sublayer's output inside the residual branch (OLMo-2, Swin v2)."""

from __future__ import annotations

from torch import Tensor

from specformer.model.context import ForwardContext
from specformer_layers.layouts.base import Block
from specformer_layers.layouts.params import PostNormInsideBlockParams


class PostNormInsideBlock(Block):
    """Block normalising each sublayer's output inside its residual branch (:class:`PostNormInsideBlockParams`)."""

    Params = PostNormInsideBlockParams

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        x = x + self.attention_norm(self.attention(x, ctx))
        return x + self.ffn_norm(self.ffn(x))
