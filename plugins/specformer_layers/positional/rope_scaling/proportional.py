"""Proportional RoPE (Gemma 4's global layers): only the first channel pairs turn, at frequencies of the whole head."""

from __future__ import annotations

import torch

from specformer_layers.positional.rope_scaling.base import RopeScaling, default_inv_freq
from specformer_layers.positional.rope_scaling.params import ProportionalScalingParams


class ProportionalScaling(RopeScaling):
    """RoPE's frequencies for the first ``fraction`` of the pairs, zero (no turn) for the rest, all divided by
    ``factor`` (:class:`ProportionalScalingParams`)."""

    Params = ProportionalScalingParams

    def __init__(self, params: ProportionalScalingParams, *, rotary_dim: int, theta: float) -> None:
        super().__init__(rotary_dim=rotary_dim, theta=theta)
        self.fraction, self.factor = params.fraction, params.factor
        turning = int(params.fraction * rotary_dim // 2)  # pairs that turn, counted as transformers counts them
        inv_freq = default_inv_freq(rotary_dim, theta)  # theta^(-2i / rotary_dim): the whole head's spacing
        inv_freq[turning:] = 0.0
        self.register_table("inv_freq", inv_freq / params.factor)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, fraction={self.fraction}, factor={self.factor}"
