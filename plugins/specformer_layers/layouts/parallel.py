"""Parallel blocks (GPT-J, GPT-NeoX/Pythia, PaLM): attention and FFN read the same input."""

from __future__ import annotations

from torch import Tensor

from specformer.model.context import ForwardContext
from specformer_layers.layouts.base import Block
from specformer_layers.layouts.params import ParallelBlockParams


class ParallelBlock(Block):
    """Parallel block: attention and feed-forward read the same input (:class:`ParallelBlockParams`)."""

    parts = ("attention_norm", "attention", "ffn_norm", "ffn")

    #: Both sublayers read the stream once and are written back together.
    residuals = {"residual": ("attention", "ffn")}

    Params = ParallelBlockParams

    def norms_made(self, params: ParallelBlockParams) -> tuple[str, ...]:
        return ("attention_norm",) if params.shared_norm else ("attention_norm", "ffn_norm")

    def norm_serves(self, name: str, params: ParallelBlockParams) -> tuple[str, ...]:
        shared = params.shared_norm and name == "attention_norm"  # it feeds the ffn too
        return ("attention", "ffn") if shared else super().norm_serves(name, params)

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        stream_in, mix = self.residual.read(x)
        h = self.attention_norm(stream_in)
        ffn_in = h if self.ffn_norm is None else self.ffn_norm(stream_in)
        return self.residual.write(x, self.attention(h, ctx), self.feed_forward(ffn_in, ctx), mix=mix)
