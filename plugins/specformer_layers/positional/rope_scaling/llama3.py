"""Llama 3.1's RoPE scaling (Meta, 2024)."""

from __future__ import annotations

import math

import torch

from specformer_layers.positional.rope_scaling.base import RopeScaling, default_inv_freq
from specformer_layers.positional.rope_scaling.params import Llama3ScalingParams


class Llama3Scaling(RopeScaling):
    """Llama 3.1's frequency-dependent scaling (:class:`Llama3ScalingParams`)."""

    Params = Llama3ScalingParams

    def __init__(self, params: Llama3ScalingParams | None = None, *, rotary_dim: int, theta: float) -> None:
        params = params if params is not None else Llama3ScalingParams()
        factor, low_freq_factor, high_freq_factor = params.factor, params.low_freq_factor, params.high_freq_factor
        original_context_length = params.original_context_length
        super().__init__(rotary_dim=rotary_dim, theta=theta)
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
