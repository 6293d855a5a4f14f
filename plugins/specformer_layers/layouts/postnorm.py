"""Post-norm blocks (the original transformer, BERT): normalise after each residual add.

The norm acts on the stream itself, so the layout needs a stream that is one vector per
token: with several streams (hyper-connections) it refuses to be built.
"""

from __future__ import annotations

from typing import Callable

from torch import Tensor, nn

from specformer.model.context import ForwardContext
from specformer.model.residual import ResidualConnection
from specformer_layers.layouts.base import Block
from specformer_layers.layouts.params import PostNormBlockParams


class PostNormBlock(Block):
    """Post-norm block: the stream is normalised after each residual add (:class:`PostNormBlockParams`)."""

    Params = PostNormBlockParams

    def __init__(self, params: PostNormBlockParams | None = None, *, mixer: nn.Module, ffn: nn.Module,
                 make_norm: Callable[[], nn.Module],
                 make_residual: Callable[[], ResidualConnection] = ResidualConnection) -> None:
        super().__init__(params, mixer=mixer, ffn=ffn, make_norm=make_norm, make_residual=make_residual)
        params = params if params is not None else self.Params()
        params.check_streams(max(self.attention_residual.n_streams, self.ffn_residual.n_streams))

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        h, mix = self.attention_residual.read(x)
        x = self.attention_norm(self.attention_residual.write(x, self.mixer(h, ctx), mix=mix))
        h, mix = self.ffn_residual.read(x)
        return self.ffn_norm(self.ffn_residual.write(x, self.feed_forward(h, ctx), mix=mix))
