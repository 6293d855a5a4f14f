"""YaRN RoPE scaling (Peng et al. 2023)."""

from __future__ import annotations

import math

import torch

from specformer_layers.positional.fp32 import rope_exponents
from specformer_layers.positional.rope_scaling.base import RopeScaling
from specformer_layers.positional.rope_scaling.params import YarnScalingParams


class YarnScaling(RopeScaling):
    """YaRN: interpolate slow channel pairs, keep fast ones, sharpen attention (:class:`YarnScalingParams`)."""

    Params = YarnScalingParams

    def __init__(self, params: YarnScalingParams, *, rotary_dim: int, theta: float, context_length: int) -> None:
        original_context_length = params.original_context_length
        factor = params.factor if params.factor is not None else context_length / original_context_length
        mscale, mscale_all_dim, attention_factor = params.mscale, params.mscale_all_dim, params.attention_factor
        if attention_factor is None:
            if mscale and mscale_all_dim:
                attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
            else:
                attention_factor = _yarn_mscale(factor, 1.0)
        super().__init__(rotary_dim=rotary_dim, theta=theta, attention_scaling=attention_factor)
        self.factor = factor
        self.original_context_length = original_context_length

        d = rotary_dim
        low, high = _correction_range(params.beta_fast, params.beta_slow, d, theta, original_context_length,
                                      params.truncate)
        if low == high:
            high += 0.001  # a ramp of zero width would divide by zero
        ramp = ((torch.arange(d // 2, dtype=torch.float32, device="cpu") - low) / (high - low)).clamp(0, 1)
        keep = 1 - ramp  # 1 where the pair keeps its original frequency (fast pairs)
        wavelength_scale = theta ** rope_exponents(d)
        extrapolated = 1.0 / wavelength_scale
        interpolated = 1.0 / (factor * wavelength_scale)
        self.register_table("inv_freq", interpolated * (1 - keep) + extrapolated * keep)


def _yarn_mscale(scale: float, mscale: float) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _correction_range(beta_fast: float, beta_slow: float, d: int, theta: float, context: int,
                      truncate: bool) -> tuple[float, float]:
    """The channel-pair indices between which the ramp runs (YaRN's eq. 17 inverted)."""

    def pair_for(rotations: float) -> float:
        # The pair index whose wavelength fits `rotations` turns into `context` tokens.
        return d * math.log(context / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = pair_for(beta_fast), pair_for(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, d - 1)
