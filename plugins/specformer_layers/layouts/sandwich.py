"""Sandwich blocks (Gemma 2, Gemma 3): a norm before and a norm after each sublayer."""

from __future__ import annotations

from typing import Callable

from torch import Tensor, nn

from specformer.context import ForwardContext
from specformer.params import Params


class SandwichBlock(nn.Module):
    """``x = x + post_norm(attention(pre_norm(x)))``; the same around the FFN (Gemma 2).

    Four norms per block: ``attention_norm`` and ``attention_post_norm`` around attention,
    ``ffn_norm`` and ``ffn_post_norm`` around the FFN. Normalising each sublayer's output
    before the residual add keeps the stream's scale in check (Ding et al. 2021, CogView).
    """

    class Params(Params):
        pass

    def __init__(self, *, attention: nn.Module, ffn: nn.Module, attention_norm: nn.Module,
                 attention_post_norm: nn.Module, ffn_norm: nn.Module, ffn_post_norm: nn.Module) -> None:
        super().__init__()
        self.attention_norm = attention_norm
        self.attention = attention
        self.attention_post_norm = attention_post_norm
        self.ffn_norm = ffn_norm
        self.ffn = ffn
        self.ffn_post_norm = ffn_post_norm

    @classmethod
    def from_params(cls, params: Params, *, d_model: int, attention: nn.Module, ffn: nn.Module,
                    make_norm: Callable[[], nn.Module], layer_index: int, n_layers: int) -> "SandwichBlock":
        return cls(attention=attention, ffn=ffn, attention_norm=make_norm(), attention_post_norm=make_norm(),
                   ffn_norm=make_norm(), ffn_post_norm=make_norm())

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        x = x + self.attention_post_norm(self.attention(self.attention_norm(x), ctx))
        return x + self.ffn_post_norm(self.ffn(self.ffn_norm(x)))
