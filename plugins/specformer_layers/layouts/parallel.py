"""Parallel blocks (GPT-J, GPT-NeoX/Pythia, PaLM): attention and FFN read the same input."""

from __future__ import annotations

from typing import Any

from pydantic import Field
from torch import Tensor

from specformer.model.context import ForwardContext
from specformer.registry.params import Params
from specformer_layers.layouts.base import Block


class ParallelBlock(Block):
    """``x = x + attention(norm_1(x)) + ffn(norm_2(x))``: one residual add, both sublayers side by side.

    With ``shared_norm`` one norm feeds both sublayers (GPT-J, PaLM; the block then has
    ``attention_norm`` only and ``ffn_norm`` is None); without it each has its own
    (GPT-NeoX, Pythia: ``attention_norm`` and ``ffn_norm``). The two sublayers can run
    concurrently, which is why large models used it (Wang & Komatsuzaki 2021).
    """

    parts = ("attention_norm", "attention", "ffn_norm", "ffn")

    class Params(Params):
        shared_norm: bool = Field(default=False, description="One norm for both sublayers (GPT-J) instead of two (GPT-NeoX).")

    @classmethod
    def norms_made(cls, params: Any) -> tuple[str, ...]:
        return ("attention_norm",) if params.shared_norm else ("attention_norm", "ffn_norm")

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        h = self.attention_norm(x)
        ffn_in = h if self.ffn_norm is None else self.ffn_norm(x)
        return x + self.attention(h, ctx) + self.ffn(ffn_in)
