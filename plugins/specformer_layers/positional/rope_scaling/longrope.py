"""LongRoPE scaling (Ding et al. 2024; Phi-3 long-context models)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from specformer_layers.positional.fp32 import rope_exponents
from specformer_layers.positional.rope_scaling.base import RopeScaling
from specformer_layers.positional.rope_scaling.params import LongRopeScalingParams


class LongRopeScaling(RopeScaling):
    """LongRoPE: a searched divisor per channel pair, short or long by the length (:class:`LongRopeScalingParams`)."""

    length_dependent = True

    Params = LongRopeScalingParams

    def __init__(self, params: LongRopeScalingParams, *, rotary_dim: int, theta: float, context_length: int) -> None:
        short_factor, long_factor = params.short_factor, params.long_factor
        original_context_length, attention_factor = params.original_context_length, params.attention_factor
        factor = params.factor if params.factor is not None else context_length / original_context_length
        params.sized(rotary_dim=rotary_dim)  # one positive factor per channel pair
        if attention_factor is None:
            attention_factor = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original_context_length))
        super().__init__(rotary_dim=rotary_dim, theta=theta, attention_scaling=attention_factor)
        self.original_context_length = original_context_length
        # Past it the long factors apply and keys cached with the short ones are stale; with
        # reencode, generation encodes the sequence again once, there (transformers' Phi-3).
        self.reencode = params.reencode
        self.restart_cache_at = original_context_length if params.reencode else None
        wavelength_scale = theta ** rope_exponents(rotary_dim)
        self.register_table("short_inv_freq", 1.0 / (torch.tensor(short_factor, dtype=torch.float32, device="cpu") * wavelength_scale))
        self.register_table("long_inv_freq", 1.0 / (torch.tensor(long_factor, dtype=torch.float32, device="cpu") * wavelength_scale))

    def frequencies(self, seq_len: Tensor | None) -> Tensor:
        if seq_len is None:
            return self.short_inv_freq
        return torch.where(seq_len > self.original_context_length, self.long_inv_freq, self.short_inv_freq)
