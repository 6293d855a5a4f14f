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
        x = x + self.attention_post_norm(self.attention(self.attention_norm(x), ctx))
        return x + self.ffn_post_norm(self.ffn(self.ffn_norm(x)))
