"""Granite's muP multipliers (granite, granitemoe, granitemoeshared, granitemoehybrid), each in a place of its own.

Nothing is folded into the weights, so export writes every multiplier back exactly:
``embedding_multiplier`` is the model's ``embedding_multiplier``; ``residual_multiplier`` the
pre-norm layout's (both sublayers' outputs are scaled before the residual add);
``attention_multiplier`` the attention's score ``scale`` (it replaces ``1/sqrt(head_dim)``);
``logits_scaling`` divides the logits, which is the model's ``logit_scale = 1 / logits_scaling``
(export writes the ``logits_scaling`` whose reciprocal is exactly that scale).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError

from specformer_hf.config import ConfigReader
from specformer_hf.parts.base import FamilyView, Part, exact_preimage
from specformer_hf.parts.embedding import embedding_multiplier_config
from specformer_hf.parts.norms import Layout
from specformer_hf.rules import Rule


def attention_multiplier_config(scale: float | None, head_dim: int) -> float:
    """The ``attention_multiplier`` of an attention with score ``scale`` (None: the usual ``1/sqrt(head_dim)``)."""
    return scale if scale is not None else head_dim ** -0.5


@dataclass(frozen=True)
class ScaledResiduals(Part):
    """Pre-norm blocks; residual_multiplier <-> the layout's ``residual_multiplier``."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        model.setdefault("block", {})["layout"] = {"kind": "prenorm",
                                                   "residual_multiplier": cfg.get_float("residual_multiplier")}

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        view.block_kind("layout", ("prenorm",))
        config["residual_multiplier"] = view.uniform("layout", "residual_multiplier")

    def rules(self) -> list[Rule]:
        return Layout("prenorm").rules()


@dataclass(frozen=True)
class AttentionMultiplier(Part):
    """attention_multiplier <-> the attention's score ``scale`` (every layer softmax attention)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        model.setdefault("block", {}).setdefault("mixer", {})["scale"] = cfg.get_float("attention_multiplier")

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        head_dim = view.attention_sizes()[2]
        config["attention_multiplier"] = attention_multiplier_config(view.uniform("mixer", "scale"), head_dim)


@dataclass(frozen=True)
class Multipliers(Part):
    """embedding_multiplier <-> the model's; logits_scaling <-> ``logit_scale = 1 / logits_scaling``."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        model["embedding_multiplier"] = cfg.get_float("embedding_multiplier")
        scaling = cfg.get_float("logits_scaling")
        if not scaling > 0:
            raise UserError(f"{cfg.family}: logits_scaling divides the logits and must be positive, got {scaling!r}")
        model["logit_scale"] = 1.0 / scaling

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        scale = view.model.logit_scale
        config["embedding_multiplier"] = embedding_multiplier_config(view.model)
        config["logits_scaling"] = exact_preimage(scale, lambda v: 1.0 / v, 1.0 / scale)


__all__ = ["AttentionMultiplier", "Multipliers", "ScaledResiduals", "attention_multiplier_config"]
