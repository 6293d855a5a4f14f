"""Pre-norm blocks (GPT-2, Llama): normalise each sublayer's input, add its output to the stream."""

from __future__ import annotations

from typing import Callable

from torch import Tensor, nn

from specformer.context import ForwardContext
from specformer.params import Params


class PreNormBlock(nn.Module):
    """``x = x + attention(norm(x))``; ``x = x + ffn(norm(x))``. Trains stably without warm-up tricks (Xiong et al. 2020)."""

    class Params(Params):
        pass

    def __init__(self, *, attention: nn.Module, ffn: nn.Module, attention_norm: nn.Module, ffn_norm: nn.Module) -> None:
        super().__init__()
        self.attention_norm = attention_norm
        self.attention = attention
        self.ffn_norm = ffn_norm
        self.ffn = ffn

    @classmethod
    def from_params(cls, params: Params, *, d_model: int, attention: nn.Module, ffn: nn.Module,
                    make_norm: Callable[[], nn.Module], layer_index: int, n_layers: int) -> "PreNormBlock":
        return cls(attention=attention, ffn=ffn, attention_norm=make_norm(), ffn_norm=make_norm())

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        x = x + self.attention(self.attention_norm(x), ctx)
        return x + self.ffn(self.ffn_norm(x))
