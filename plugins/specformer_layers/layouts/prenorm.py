"""Pre-norm blocks (GPT-2, Llama): normalise each sublayer's input, add its output to the stream."""

from __future__ import annotations

from torch import Tensor

from specformer.model.context import ForwardContext
from specformer_layers.layouts.base import Block
from specformer_layers.layouts.params import PreNormBlockParams


class PreNormBlock(Block):
    """Pre-norm block: each sublayer reads the normalised stream (:class:`PreNormBlockParams`)."""

    parts = ("attention_norm", "attention", "ffn_norm", "ffn")

    Params = PreNormBlockParams

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        x = x + self.attention(self.attention_norm(x), ctx)
        return x + self.ffn(self.ffn_norm(x))
