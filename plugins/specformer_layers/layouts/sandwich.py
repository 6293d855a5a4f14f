"""Sandwich blocks (Gemma 2, Gemma 3): a norm before and a norm after each sublayer."""

from __future__ import annotations

from torch import Tensor

from specformer.model.context import ForwardContext
from specformer_layers.layouts.base import Block


class SandwichBlock(Block):
    """``x = x + post_norm(attention(pre_norm(x)))``; the same around the FFN (Gemma 2).

    Four norms per block: ``attention_norm`` and ``attention_post_norm`` around attention,
    ``ffn_norm`` and ``ffn_post_norm`` around the FFN. Normalising each sublayer's output
    before the residual add keeps the stream's scale in check (Ding et al. 2021, CogView).
    """

    parts = ("attention_norm", "attention", "attention_post_norm", "ffn_norm", "ffn", "ffn_post_norm")

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        x = x + self.attention_post_norm(self.attention(self.attention_norm(x), ctx))
        return x + self.ffn_post_norm(self.ffn(self.ffn_norm(x)))
