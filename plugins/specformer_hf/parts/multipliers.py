"""Granite's muP multipliers (granite, granitemoe, granitemoeshared, granitemoehybrid, hyperclovax), each in a place of
its own.

Nothing is folded into the weights, so export writes every multiplier back exactly:
``embedding_multiplier`` is the model's ``embedding_multiplier``; ``residual_multiplier`` the
layout's (both sublayers' outputs are scaled before the residual add; after the post norm where
the blocks are sandwiches, HyperCLOVA X's ``use_post_norm``);
``attention_multiplier`` the attention's score ``scale`` (it replaces ``1/sqrt(head_dim)``; a
missing one means that usual scale); ``logits_scaling`` divides the logits in Granite, which is the
model's ``logit_scale = 1 / logits_scaling`` (export writes the ``logits_scaling`` whose reciprocal
is exactly that scale), and multiplies them in HyperCLOVA X (``logit_scale = logits_scaling``).
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
from specformer_hf.specview import NotExpressible


def attention_multiplier_config(scale: float | None, head_dim: int) -> float:
    """The ``attention_multiplier`` of an attention with score ``scale`` (None: the usual ``1/sqrt(head_dim)``)."""
    return scale if scale is not None else head_dim ** -0.5


@dataclass(frozen=True)
class ScaledResiduals(Part):
    """Pre-norm blocks; residual_multiplier <-> the layout's ``residual_multiplier``.

    ``post_norm_key`` names a boolean config field that makes the blocks sandwiches (a norm after
    each sublayer too, the multiplier applied after it: HyperCLOVA X's ``use_post_norm``), whose
    norm tensors ``sandwich_names`` names (our name, Hugging Face name).
    """

    post_norm_key: str | None = None
    sandwich_names: tuple[tuple[str, str], ...] = ()

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        kind = "sandwich" if self.post_norm_key and cfg.get(self.post_norm_key) else "prenorm"
        model.setdefault("block", {})["layout"] = {"kind": kind,
                                                   "residual_multiplier": cfg.get_float("residual_multiplier")}

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        kind = view.block_kind("layout", ("prenorm", "sandwich") if self.post_norm_key else ("prenorm",))
        if kind == "sandwich":
            for name, value in (("ffn_pre_norm", True), ("layer_scale", False)):
                if view.uniform("layout", name) != value:
                    raise NotExpressible(f"model.block.layout.{name}", f"Hugging Face {view.name}'s sandwich blocks "
                                         f"have {name}: {str(value).lower()}")
        if self.post_norm_key:
            config[self.post_norm_key] = kind == "sandwich"
        config["residual_multiplier"] = view.uniform("layout", "residual_multiplier")

    def rules(self) -> list[Rule]:
        if not self.post_norm_key:
            return Layout("prenorm").rules()
        # A pre-norm model has only the first and third of the sandwich's norms: the others' rules then match nothing.
        return Layout("sandwich", names=self.sandwich_names).rules()


@dataclass(frozen=True)
class AttentionMultiplier(Part):
    """attention_multiplier <-> the attention's score ``scale`` (every layer softmax attention)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        if cfg.get("attention_multiplier") is None:  # HyperCLOVA X's config leaves it None: 1/sqrt(head_dim)
            return
        model.setdefault("block", {}).setdefault("mixer", {})["scale"] = cfg.get_float("attention_multiplier")

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        head_dim = view.attention_sizes()[2]
        config["attention_multiplier"] = attention_multiplier_config(view.uniform("mixer", "scale"), head_dim)


@dataclass(frozen=True)
class Multipliers(Part):
    """embedding_multiplier <-> the model's; logits_scaling <-> ``logit_scale = 1 / logits_scaling``.

    ``logits_multiplied``: logits_scaling multiplies the logits instead (HyperCLOVA X), ``logit_scale = logits_scaling``.
    """

    logits_multiplied: bool = False

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        model["embedding_multiplier"] = cfg.get_float("embedding_multiplier")
        scaling = cfg.get_float("logits_scaling")
        if not scaling > 0:
            how = "multiplies" if self.logits_multiplied else "divides"
            raise UserError(f"{cfg.family}: logits_scaling {how} the logits and must be positive, got {scaling!r}")
        model["logit_scale"] = scaling if self.logits_multiplied else 1.0 / scaling

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        scale = view.model.logit_scale
        config["embedding_multiplier"] = embedding_multiplier_config(view.model)
        config["logits_scaling"] = (scale if self.logits_multiplied
                                    else exact_preimage(scale, lambda v: 1.0 / v, 1.0 / scale))


__all__ = ["AttentionMultiplier", "Multipliers", "ScaledResiduals", "attention_multiplier_config"]
