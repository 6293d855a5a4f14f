"""Parallel blocks (GPT-J, GPT-NeoX/Pythia, PaLM): attention and FFN read the same input."""

from __future__ import annotations

from typing import Callable

from pydantic import Field
from torch import Tensor, nn

from specformer.context import ForwardContext
from specformer.params import Params


class ParallelBlock(nn.Module):
    """``x = x + attention(norm_1(x)) + ffn(norm_2(x))``: one residual add, both sublayers side by side.

    With ``shared_norm`` one norm feeds both sublayers (GPT-J, PaLM; the block then has
    ``attention_norm`` only and ``ffn_norm`` is None); without it each has its own
    (GPT-NeoX, Pythia: ``attention_norm`` and ``ffn_norm``). The two sublayers can run
    concurrently, which is why large models used it (Wang & Komatsuzaki 2021).
    """

    class Params(Params):
        shared_norm: bool = Field(default=False, description="One norm for both sublayers (GPT-J) instead of two (GPT-NeoX).")

    def __init__(self, *, attention: nn.Module, ffn: nn.Module, attention_norm: nn.Module,
                 ffn_norm: nn.Module | None = None) -> None:
        super().__init__()
        self.attention_norm = attention_norm
        self.attention = attention
        self.ffn_norm = ffn_norm
        self.ffn = ffn

    @classmethod
    def from_params(cls, params: Params, *, d_model: int, attention: nn.Module, ffn: nn.Module,
                    make_norm: Callable[[], nn.Module], layer_index: int, n_layers: int) -> "ParallelBlock":
        return cls(attention=attention, ffn=ffn, attention_norm=make_norm(),
                   ffn_norm=None if params.shared_norm else make_norm())

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        h = self.attention_norm(x)
        ffn_in = h if self.ffn_norm is None else self.ffn_norm(x)
        return x + self.attention(h, ctx) + self.ffn(ffn_in)
