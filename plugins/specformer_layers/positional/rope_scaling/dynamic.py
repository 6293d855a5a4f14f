"""Dynamic NTK-aware RoPE scaling (bloc97 and emozilla, 2023; as in transformers' ``dynamic``)."""

from __future__ import annotations

import torch
from torch import Tensor

from specformer_layers.positional.fp32 import rope_exponents
from specformer_layers.positional.rope_scaling.base import RopeScaling
from specformer_layers.positional.rope_scaling.params import DynamicNTKScalingParams


class DynamicNTKScaling(RopeScaling):
    """Dynamic NTK-aware scaling: theta grows with the length past the trained context (:class:`DynamicNTKScalingParams`)."""

    length_dependent = True
    keeps_adapting = True

    Params = DynamicNTKScalingParams

    def __init__(self, params: DynamicNTKScalingParams, *, rotary_dim: int, theta: float, context_length: int) -> None:
        factor = params.factor
        original_context_length = params.original_context_length or context_length
        params.sized(rotary_dim=rotary_dim)  # an even rotary_dim above 2
        super().__init__(rotary_dim=rotary_dim, theta=theta)
        self.factor = factor
        self.original_context_length = original_context_length
        self.register_table("exponents", rope_exponents(rotary_dim))

    def frequencies(self, seq_len: Tensor | None) -> Tensor:
        if seq_len is None:
            seq_len = torch.tensor(self.original_context_length, device=self.exponents.device)
        # A tensor all along: no host sync, and traceable by torch.compile.
        seq_len = seq_len.clamp(min=self.original_context_length)
        d = self.rotary_dim
        stretch = self.factor * seq_len / self.original_context_length - (self.factor - 1)
        base = self.theta * stretch ** (d / (d - 2))
        return 1.0 / (base ** self.exponents)
