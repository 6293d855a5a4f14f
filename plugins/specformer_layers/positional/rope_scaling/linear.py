"""Linear RoPE scaling, i.e. position interpolation (Chen et al. 2023; kaiokendev)."""

from __future__ import annotations

from specformer_layers.positional.rope_scaling.base import RopeScaling, default_inv_freq
from specformer_layers.positional.rope_scaling.params import LinearScalingParams


class LinearScaling(RopeScaling):
    """Position interpolation: every frequency divided by one factor (:class:`LinearScalingParams`)."""

    Params = LinearScalingParams

    def __init__(self, params: LinearScalingParams, *, rotary_dim: int, theta: float) -> None:
        factor = params.factor
        super().__init__(rotary_dim=rotary_dim, theta=theta)
        self.factor = factor
        self.register_table("inv_freq", default_inv_freq(rotary_dim, theta) / factor)
