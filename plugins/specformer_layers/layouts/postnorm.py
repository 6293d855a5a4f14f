"""Post-norm blocks (the original transformer, BERT): normalise after each residual add."""

from __future__ import annotations

from torch import Tensor

from specformer.model.context import ForwardContext
from specformer_layers.layouts.base import Block


class PostNormBlock(Block):
    """``x = norm(x + attention(x))``; ``x = norm(x + ffn(x))`` (Vaswani et al. 2017)."""

    parts = ("attention", "attention_norm", "ffn", "ffn_norm")

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        x = self.attention_norm(x + self.attention(x, ctx))
        return self.ffn_norm(x + self.ffn(x))
