"""Post-norm blocks (the original transformer, BERT): normalise after each residual add."""

from __future__ import annotations

from torch import Tensor

from specformer.model.context import ForwardContext
from specformer_layers.layouts.base import Block
from specformer_layers.layouts.params import PostNormBlockParams


class PostNormBlock(Block):
    """Post-norm block: the stream is normalised after each residual add (:class:`PostNormBlockParams`)."""

    Params = PostNormBlockParams

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        x = self.attention_norm(x + self.attention(x, ctx))
        return self.ffn_norm(x + self.ffn(x))
