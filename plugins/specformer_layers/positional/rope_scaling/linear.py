"""Linear RoPE scaling, i.e. position interpolation (Chen et al. 2023; kaiokendev)."""

from __future__ import annotations

from pydantic import Field

from specformer.registry.params import FromParams, Params
from specformer_layers.positional.rope_scaling.base import RopeScaling, check_factor, default_inv_freq


class LinearScaling(FromParams, RopeScaling):
    """Divide every frequency by ``factor``: position ``p`` is rotated as ``p / factor`` was.

    A model trained on ``L`` tokens then sees ``factor * L`` positions squeezed into the
    angles it knows. Needs some fine-tuning to work well (Chen et al. 2023).
    """

    class Params(Params):
        factor: float = Field(gt=0, description="How many times longer the context becomes; frequencies are divided by it.")

    def __init__(self, *, rotary_dim: int, theta: float, factor: float) -> None:
        super().__init__(rotary_dim=rotary_dim, theta=theta)
        check_factor("linear rope scaling", factor)
        self.factor = factor
        self.register_table("inv_freq", default_inv_freq(rotary_dim, theta) / factor)
