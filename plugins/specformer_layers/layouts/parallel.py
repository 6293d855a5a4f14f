"""Parallel blocks (GPT-J, GPT-NeoX/Pythia, PaLM): attention and FFN read the same input."""

from __future__ import annotations

from torch import Tensor

from specformer.model.context import ForwardContext
from specformer_layers.layouts.base import Block
from specformer_layers.layouts.params import ParallelBlockParams


class ParallelBlock(Block):
    """Parallel block: attention and feed-forward read the same input (:class:`ParallelBlockParams`)."""

    Params = ParallelBlockParams

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        stream_in, mix = self.residual.read(x)
        h = self.attention_norm(stream_in)
        ffn_in = h if self.ffn_norm is None else self.ffn_norm(stream_in)
        return self.residual.write(x, self.mixer(h, ctx), self.feed_forward(ffn_in, ctx), mix=mix)
