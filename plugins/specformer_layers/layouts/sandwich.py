"""Sandwich blocks (Gemma 2, Gemma 3): a norm before and a norm after each sublayer."""

from __future__ import annotations

from torch import Tensor

from specformer.model.context import ForwardContext
from specformer_layers.layouts.base import Block
from specformer_layers.layouts.params import SandwichBlockParams


class SandwichBlock(Block):
    """Sandwich block: a norm before and after each sublayer (:class:`SandwichBlockParams`)."""

    Params = SandwichBlockParams

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        h, mix = self.attention_residual.read(x)
        x = self.attention_residual.write(x, self.attention_post_norm(self.attention(self.attention_norm(h), ctx)), mix=mix)
        h, mix = self.ffn_residual.read(x)
        return self.ffn_residual.write(x, self.ffn_post_norm(self.feed_forward(self.ffn_norm(h), ctx)), mix=mix)
