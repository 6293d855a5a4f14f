"""YaRN RoPE scaling (Peng et al. 2023)."""

from __future__ import annotations

import math

import torch
from pydantic import Field, model_validator

from specformer.registry.params import Params
from specformer_layers.positional.fp32 import rope_exponents
from specformer_layers.positional.rope_scaling.base import RopeScaling, check_factor


class YarnScaling(RopeScaling):
    """Interpolate low frequencies, keep high ones, blend in between; sharpen attention.

    Channel pairs that turn fewer than ``beta_slow`` times over the original context are
    interpolated (divided by ``factor``), pairs that turn more than ``beta_fast`` times are
    left alone, and a linear ramp blends the pairs between. cos and sin are multiplied by
    the attention factor ``0.1 * mscale * ln(factor) + 1`` (or the ratio of two such
    terms with ``mscale`` and ``mscale_all_dim``, DeepSeek style, or ``attention_factor``
    when given), exactly as transformers' ``yarn`` does.
    """

    class Params(Params):
        factor: float | None = Field(
            default=None, gt=0,
            description="Context extension ratio; default context_length / original_context_length.",
        )
        original_context_length: int = Field(gt=0, description="The context length the model was pre-trained with.")
        beta_fast: float = Field(default=32.0, gt=0, description="Pairs turning more often than this over the original context keep their frequency.")
        beta_slow: float = Field(default=1.0, gt=0, description="Pairs turning less often than this are fully interpolated.")
        mscale: float | None = Field(default=None, description="Scales ln(factor) in the attention factor (with mscale_all_dim).")
        mscale_all_dim: float | None = Field(default=None, description="Denominator's mscale of the attention factor (DeepSeek).")
        attention_factor: float | None = Field(default=None, gt=0, description="Multiplier of cos/sin; default from factor and mscale.")
        truncate: bool = Field(default=True, description="Round the ramp's bounds to whole channel pairs (floor/ceil).")

        @model_validator(mode="after")
        def _fast_above_slow(self) -> "YarnScaling.Params":
            if self.beta_fast < self.beta_slow:
                raise ValueError(f"beta_fast ({self.beta_fast}) must be at least beta_slow ({self.beta_slow})")
            return self

    def __init__(
        self,
        *,
        rotary_dim: int,
        theta: float,
        factor: float,
        original_context_length: int,
        beta_fast: float = 32.0,
        beta_slow: float = 1.0,
        mscale: float | None = None,
        mscale_all_dim: float | None = None,
        attention_factor: float | None = None,
        truncate: bool = True,
    ) -> None:
        check_factor("yarn rope scaling", factor)
        if attention_factor is None:
            if mscale and mscale_all_dim:
                attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
            else:
                attention_factor = _yarn_mscale(factor, 1.0)
        super().__init__(rotary_dim=rotary_dim, theta=theta, attention_scaling=attention_factor)
        self.factor = factor
        self.original_context_length = original_context_length

        d = rotary_dim
        low, high = _correction_range(beta_fast, beta_slow, d, theta, original_context_length, truncate)
        if low == high:
            high += 0.001  # a ramp of zero width would divide by zero
        ramp = ((torch.arange(d // 2, dtype=torch.float32, device="cpu") - low) / (high - low)).clamp(0, 1)
        keep = 1 - ramp  # 1 where the pair keeps its original frequency (fast pairs)
        wavelength_scale = theta ** rope_exponents(d)
        extrapolated = 1.0 / wavelength_scale
        interpolated = 1.0 / (factor * wavelength_scale)
        self.register_table("inv_freq", interpolated * (1 - keep) + extrapolated * keep)

    @classmethod
    def from_params(cls, params: Params, *, rotary_dim: int, theta: float, context_length: int) -> "YarnScaling":
        factor = params.factor if params.factor is not None else context_length / params.original_context_length
        return cls(rotary_dim=rotary_dim, theta=theta, factor=factor,
                   original_context_length=params.original_context_length, beta_fast=params.beta_fast,
                   beta_slow=params.beta_slow, mscale=params.mscale, mscale_all_dim=params.mscale_all_dim,
                   attention_factor=params.attention_factor, truncate=params.truncate)


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
