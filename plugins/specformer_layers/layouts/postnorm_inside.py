"""Blocks that normalise each sublayer's output inside the residual branch (OLMo-2, Swin v2)."""

from __future__ import annotations

from typing import Callable

from torch import Tensor, nn

from specformer.context import ForwardContext
from specformer.params import Params


class PostNormInsideBlock(nn.Module):
    """``x = x + norm(attention(x))``; ``x = x + norm(ffn(x))`` (OLMo-2).

    Sublayers read the raw residual stream; their outputs are normalised before being
    added (``attention_norm`` and ``ffn_norm``), which the OLMo 2 report found more
    stable than pre-norm. Unlike ``postnorm``, the stream itself is never normalised.
    """

    class Params(Params):
        pass

    def __init__(self, *, attention: nn.Module, ffn: nn.Module, attention_norm: nn.Module, ffn_norm: nn.Module) -> None:
        super().__init__()
        self.attention = attention
        self.attention_norm = attention_norm
        self.ffn = ffn
        self.ffn_norm = ffn_norm

    @classmethod
    def from_params(cls, params: Params, *, d_model: int, attention: nn.Module, ffn: nn.Module,
                    make_norm: Callable[[], nn.Module], layer_index: int, n_layers: int) -> "PostNormInsideBlock":
        return cls(attention=attention, ffn=ffn, attention_norm=make_norm(), ffn_norm=make_norm())

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        x = x + self.attention_norm(self.attention(x, ctx))
        return x + self.ffn_norm(self.ffn(x))
