"""Pre-norm blocks (GPT-2, Llama): normalise each sublayer's input, add its output to the stream."""

from __future__ import annotations

from typing import Callable

from torch import Tensor, nn

from specformer.model.context import ForwardContext
from specformer_layers.layouts.base import Block
from specformer_layers.layouts.params import PreNormBlockParams


class PreNormBlock(Block):
    """Pre-norm block: each sublayer reads the normalised stream (:class:`PreNormBlockParams`)."""

    Params = PreNormBlockParams

    def __init__(self, params: PreNormBlockParams | None = None, *, attention: nn.Module, ffn: nn.Module,
                 make_norm: Callable[[], nn.Module]) -> None:
        params = params if params is not None else PreNormBlockParams()
        super().__init__(params, attention=attention, ffn=ffn, make_norm=make_norm)
        self.residual_multiplier = params.residual_multiplier

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        r = self.residual_multiplier
        if r == 1.0:
            x = x + self.attention(self.attention_norm(x), ctx)
            return x + self.ffn(self.ffn_norm(x))
        x = x + self.attention(self.attention_norm(x), ctx) * r
        return x + self.ffn(self.ffn_norm(x)) * r
