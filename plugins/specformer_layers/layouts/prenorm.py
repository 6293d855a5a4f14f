"""Pre-norm blocks (GPT-2, Llama): normalise each sublayer's input, add its output to the stream."""

from __future__ import annotations

from torch import Tensor

from specformer.model.context import ForwardContext
from specformer_layers.layouts.base import Block


class PreNormBlock(Block):
    """``x = x + attention(norm(x))``; ``x = x + ffn(norm(x))``. Trains stably without warm-up tricks (Xiong et al. 2020)."""

    parts = ("attention_norm", "attention", "ffn_norm", "ffn")

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        x = x + self.attention(self.attention_norm(x), ctx)
        return x + self.ffn(self.ffn_norm(x))
