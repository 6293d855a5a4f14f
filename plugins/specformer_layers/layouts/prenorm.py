"""Pre-norm blocks (GPT-2, Llama): normalise each sublayer's input, add its output to the stream."""

from __future__ import annotations

from typing import Callable

from torch import Tensor, nn

from specformer.model.context import ForwardContext
from specformer.model.residual import ResidualConnection
from specformer_layers.layouts.base import Block
from specformer_layers.layouts.params import PreNormBlockParams


class PreNormBlock(Block):
    """Pre-norm block: each sublayer reads the normalised stream (:class:`PreNormBlockParams`)."""

    Params = PreNormBlockParams

    def __init__(self, params: PreNormBlockParams | None = None, *, mixer: nn.Module, ffn: nn.Module,
                 make_norm: Callable[[], nn.Module],
                 make_residual: Callable[[], ResidualConnection] = ResidualConnection) -> None:
        params = params if params is not None else PreNormBlockParams()
        super().__init__(params, mixer=mixer, ffn=ffn, make_norm=make_norm, make_residual=make_residual)
        self.residual_multiplier = params.residual_multiplier

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        r = self.residual_multiplier
        h, mix = self.attention_residual.read(x)
        out = self.mixer(self.attention_norm(h), ctx)
        x = self.attention_residual.write(x, out if r == 1.0 else out * r, mix=mix)
        h, mix = self.ffn_residual.read(x)
        out = self.feed_forward(self.ffn_norm(h), ctx)
        return self.ffn_residual.write(x, out if r == 1.0 else out * r, mix=mix)
