"""Blocks that normalise each sublayer's output inside the residual branch (OLMo-2, Swin v2)."""

from __future__ import annotations

from torch import Tensor

from specformer.model.context import ForwardContext
from specformer_layers.layouts.base import Block


class PostNormInsideBlock(Block):
    """``x = x + norm(attention(x))``; ``x = x + norm(ffn(x))`` (OLMo-2).

    Sublayers read the raw residual stream; their outputs are normalised before being
    added (``attention_norm`` and ``ffn_norm``), which the OLMo 2 report found more
    stable than pre-norm. Unlike ``postnorm``, the stream itself is never normalised.
    """

    parts = ("attention", "attention_norm", "ffn", "ffn_norm")

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        x = x + self.attention_norm(self.attention(x, ctx))
        return x + self.ffn_norm(self.ffn(x))
