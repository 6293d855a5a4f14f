"""Post-norm blocks (the original transformer, BERT): normalise after each residual add."""

from __future__ import annotations

from typing import Callable

from torch import Tensor, nn

from specformer.context import ForwardContext
from specformer.params import Params


class PostNormBlock(nn.Module):
    """``x = norm(x + attention(x))``; ``x = norm(x + ffn(x))`` (Vaswani et al. 2017)."""

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
                    make_norm: Callable[[], nn.Module], layer_index: int, n_layers: int) -> "PostNormBlock":
        return cls(attention=attention, ffn=ffn, attention_norm=make_norm(), ffn_norm=make_norm())

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        x = self.attention_norm(x + self.attention(x, ctx))
        return self.ffn_norm(x + self.ffn(x))
