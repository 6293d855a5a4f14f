"""Llama 3.1's RoPE scaling (Meta, 2024)."""

from __future__ import annotations

import math

import torch
from pydantic import Field, model_validator

from specformer.registry.params import FromParams, Params
from specformer_layers.positional.rope_scaling.base import RopeScaling, check_factor, default_inv_freq


class Llama3Scaling(FromParams, RopeScaling):
    """Divide long-wavelength frequencies by ``factor``, keep short ones, blend smoothly between.

    With ``C`` the original context: a pair whose wavelength exceeds ``C / low_freq_factor``
    is divided by ``factor``; one shorter than ``C / high_freq_factor`` is kept; in between,
    ``(1 - s) * f / factor + s * f`` with ``s = (C / wavelength - low) / (high - low)``.
    The defaults are Llama 3.1's.
    """

    class Params(Params):
        factor: float = Field(default=8.0, gt=0, description="Divisor of the low frequencies (8 for Llama 3.1, 32 for Llama 3.2).")
        low_freq_factor: float = Field(default=1.0, gt=0, description="Wavelengths above C / low_freq_factor are fully scaled.")
        high_freq_factor: float = Field(default=4.0, gt=0, description="Wavelengths below C / high_freq_factor are kept.")
        original_context_length: int = Field(default=8192, gt=0, description="The pre-training context C.")

        @model_validator(mode="after")
        def _high_above_low(self) -> "Llama3Scaling.Params":
            if self.high_freq_factor <= self.low_freq_factor:
                raise ValueError(
                    f"high_freq_factor ({self.high_freq_factor}) must be greater than low_freq_factor ({self.low_freq_factor})"
                )
            return self

    def __init__(self, *, rotary_dim: int, theta: float, factor: float = 8.0, low_freq_factor: float = 1.0,
                 high_freq_factor: float = 4.0, original_context_length: int = 8192) -> None:
        super().__init__(rotary_dim=rotary_dim, theta=theta)
        check_factor("llama3 rope scaling", factor)
        if high_freq_factor <= low_freq_factor:
            raise ValueError(f"high_freq_factor ({high_freq_factor}) must be greater than low_freq_factor ({low_freq_factor})")
        self.factor = factor
        freq = default_inv_freq(rotary_dim, theta)
        wavelength = 2 * math.pi / freq
        long_wave = original_context_length / low_freq_factor
        short_wave = original_context_length / high_freq_factor
        smooth = (original_context_length / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
        scaled = torch.where(wavelength > long_wave, freq / factor, freq)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        middle = (wavelength >= short_wave) & (wavelength <= long_wave)
        self.register_table("inv_freq", torch.where(middle, blended, scaled))
