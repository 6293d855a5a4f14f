"""LongRoPE scaling (Ding et al. 2024; Phi-3 long-context models)."""

from __future__ import annotations

import math

import torch
from pydantic import Field
from torch import Tensor

from specformer.registry.params import Params
from specformer_layers.positional.fp32 import rope_exponents
from specformer_layers.positional.rope_scaling.base import RopeScaling


class LongRopeScaling(RopeScaling):
    """Divide each pair's frequency by its own searched factor: ``short_factor`` or ``long_factor``.

    A forward pass whose longest position reaches past ``original_context_length`` uses the
    long factors, a shorter one the short factors (taken over the whole batch, as
    transformers does). cos and sin are multiplied by ``attention_factor``, by default
    ``sqrt(1 + ln(factor) / ln(original_context_length))``. Under a KV cache, keys keep
    the rotation of the step that wrote them (as transformers' Llama does), unless
    ``reencode``: then generation encodes the whole sequence again, once, when it first
    passes ``original_context_length``, so every key uses the long factors (as
    transformers' Phi-3 ``generate`` does by dropping its cache there).
    """

    length_dependent = True

    class Params(Params):
        short_factor: list[float] = Field(description="One divisor per rotary channel pair (rotary_dim / 2 values) for short inputs.")
        long_factor: list[float] = Field(description="One divisor per rotary channel pair for inputs longer than original_context_length.")
        original_context_length: int = Field(gt=0, description="The pre-training context length.")
        factor: float | None = Field(default=None, gt=0, description="Context extension ratio for the attention factor; default context_length / original_context_length.")
        attention_factor: float | None = Field(default=None, gt=0, description="Multiplier of cos/sin; default from factor.")
        reencode: bool = Field(
            default=False,
            description="Generation re-encodes the sequence once when it passes original_context_length (Phi-3's "
                        "transformers generate does); otherwise cached keys keep their short-factor rotation (Llama's).",
        )

    def __init__(self, *, rotary_dim: int, theta: float, short_factor: list[float], long_factor: list[float],
                 original_context_length: int, factor: float, attention_factor: float | None = None,
                 reencode: bool = False) -> None:
        for name, values in (("short_factor", short_factor), ("long_factor", long_factor)):
            if len(values) != rotary_dim // 2:
                raise ValueError(
                    f"longrope {name} has {len(values)} values; it needs one per rotary channel pair: {rotary_dim // 2}"
                )
            if any(v <= 0 for v in values):
                raise ValueError(f"longrope {name} values must be > 0, got {values}")
        if attention_factor is None:
            attention_factor = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original_context_length))
        super().__init__(rotary_dim=rotary_dim, theta=theta, attention_scaling=attention_factor)
        self.original_context_length = original_context_length
        # Past it the long factors apply and keys cached with the short ones are stale; with
        # reencode, generation encodes the sequence again once, there (transformers' Phi-3).
        self.reencode = reencode
        self.restart_cache_at = original_context_length if reencode else None
        wavelength_scale = theta ** rope_exponents(rotary_dim)
        self.register_table("short_inv_freq", 1.0 / (torch.tensor(short_factor, dtype=torch.float32, device="cpu") * wavelength_scale))
        self.register_table("long_inv_freq", 1.0 / (torch.tensor(long_factor, dtype=torch.float32, device="cpu") * wavelength_scale))

    @classmethod
    def from_params(cls, params: Params, *, rotary_dim: int, theta: float, context_length: int) -> "LongRopeScaling":
        factor = params.factor if params.factor is not None else context_length / params.original_context_length
        return cls(rotary_dim=rotary_dim, theta=theta, short_factor=params.short_factor, long_factor=params.long_factor,
                   original_context_length=params.original_context_length, factor=factor,
                   attention_factor=params.attention_factor, reencode=params.reencode)

    def frequencies(self, seq_len: Tensor | None) -> Tensor:
        if seq_len is None:
            return self.short_inv_freq
        return torch.where(seq_len > self.original_context_length, self.long_inv_freq, self.short_inv_freq)
