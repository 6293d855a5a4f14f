"""The settings of the adapters, in a module that imports no torch.

Each model's docstring is the adapter's description in the catalogue (its first line the summary).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from specformer.registry.params import Params, SubComponent
from specformer.renamed import current_patterns


class AdapterParams(Params):
    """What every adapter shares: where it goes and how the frozen base is held."""

    targets: list[str] = Field(
        default_factory=lambda: ["blocks.*.mixer.*"], min_length=1,
        description="Linear layers to adapt, by the model's own module paths with globs: `*` within a segment, "
                    "`**` across (e.g. `blocks.*.mixer.qkv`, `blocks.*.ffn.*`).")
    base: SubComponent("quantization") | None = Field(  # type: ignore[valid-type]
        default=None,
        description="Hold the frozen base weights at lower precision (a quantization scheme: bf16, int8); "
                    "null keeps them as loaded.")

    @field_validator("targets")
    @classmethod
    def _current_names(cls, targets: list[str]) -> list[str]:
        # Targets written before the block's `attention` became `mixer` (blocks.*.attention.qkv) still select.
        return current_patterns(targets, where="adapter targets")


class LoRAParams(AdapterParams):
    """Low-rank adapters: each target linear layer gains a trainable update B @ A * alpha / rank.

    B starts at zero, so training starts from the base model exactly; the base weights stay frozen.
    """

    rank: int = Field(default=8, gt=0, le=4096, description="Rank r of the update B @ A.")
    alpha: float = Field(default=16.0, gt=0, description="The update is scaled by alpha / rank.")
    dropout: float = Field(default=0.0, ge=0, lt=1, description="Dropout on the adapter's input (training only).")
    init: Literal["kaiming", "gaussian"] = Field(
        default="kaiming", description="A's initialisation: kaiming (PEFT's default) or gaussian (std 1/rank); B is zero.")
