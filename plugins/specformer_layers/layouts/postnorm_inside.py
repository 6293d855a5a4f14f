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
        h, mix = self.attention_residual.read(x)
        x = self.attention_residual.write(x, self.attention_norm(self.mixer(h, ctx)), mix=mix)
        h, mix = self.ffn_residual.read(x)
        return self.ffn_residual.write(x, self.ffn_norm(self.feed_forward(h, ctx)), mix=mix)
