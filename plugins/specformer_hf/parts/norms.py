"""Norms and the block layout that places them: RMSNorm, LayerNorm, and each layout's norm tensors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer_hf.config import ConfigReader
from specformer_hf.parts.base import LAYER, FamilyView, Part
from specformer_hf.rules import Copy, Rule
from specformer_hf.specview import NotExpressible, SpecView


def rmsnorm(cfg: ConfigReader, *, eps_key: str = "rms_norm_eps", offset: float = 0.0) -> dict[str, Any]:
    norm: dict[str, Any] = {"kind": "rmsnorm", "eps": cfg.get_float(eps_key)}
    if offset:
        norm["offset"] = offset
    return norm


def rmsnorm_config(view: SpecView, family: str, *, eps_key: str = "rms_norm_eps") -> dict[str, Any]:
    view.block_kind("norm", ("rmsnorm",), family=family)
    return {eps_key: view.uniform("norm", "eps", family=family)}


#: Each layout's norm tensors, Llama-style names (our name, Hugging Face name).
LAYOUT_NORMS: dict[str, tuple[tuple[str, str], ...]] = {
    "prenorm": (("attention_norm", "input_layernorm"), ("ffn_norm", "post_attention_layernorm")),
    "postnorm_inside": (("attention_norm", "post_attention_layernorm"), ("ffn_norm", "post_feedforward_layernorm")),
    "sandwich": (("attention_norm", "input_layernorm"), ("attention_post_norm", "post_attention_layernorm"),
                 ("ffn_norm", "pre_feedforward_layernorm"), ("ffn_post_norm", "post_feedforward_layernorm")),
    "parallel": (("attention_norm", "input_layernorm"),),  # one shared norm (GPT-J style)
}


@dataclass(frozen=True)
class Layout(Part):
    """The block layout (which fixes the norms' places and their tensor names).

    ``parallel_key`` names a boolean config field that switches to parallel attention and
    feed-forward sharing one norm (StableLM's use_parallel_residual).
    """

    kind: str = "prenorm"
    #: Norms with biases (LayerNorm) have ``.bias`` tensors too.
    norm_bias: bool = False
    parallel_key: str | None = None
    #: (our name, Hugging Face name) pairs where the family names the layout's norms otherwise than
    #: :data:`LAYOUT_NORMS` (GLM-4's sandwich: post_self_attn_layernorm, post_mlp_layernorm).
    names: tuple[tuple[str, str], ...] = ()

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        kind = "parallel" if self.parallel_key and cfg.get(self.parallel_key) else self.kind
        model.setdefault("block", {})["layout"] = {"kind": "parallel", "shared_norm": True} if kind == "parallel" else kind

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        kind = view.block_kind("layout", (self.kind, "parallel") if self.parallel_key else (self.kind,))
        if kind == "parallel" and not view.uniform("layout", "shared_norm"):
            raise NotExpressible("model.block.layout.shared_norm", f"Hugging Face {view.name}'s parallel blocks share one norm")
        if self.parallel_key:
            config[self.parallel_key] = kind == "parallel"

    def rules(self) -> list[Rule]:
        suffixes = ("weight", "bias") if self.norm_bias else ("weight",)
        names = dict(self.names or LAYOUT_NORMS[self.kind])
        if self.parallel_key:
            names.update(LAYOUT_NORMS["parallel"])  # a parallel block has only the first norm: its rule is skipped otherwise
        return [Copy(f"{LAYER}.{hf}.{s}", f"blocks.{{i}}.{ours}.{s}") for ours, hf in names.items() for s in suffixes]


@dataclass(frozen=True)
class RMSNorm(Part):
    """RMSNorm everywhere, eps from ``eps_key``; ``offset`` 1 for Gemma's (1 + w) weights."""

    eps_key: str = "rms_norm_eps"
    offset: float = 0.0

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        model.setdefault("block", {})["norm"] = rmsnorm(cfg, eps_key=self.eps_key, offset=self.offset)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        config.update(rmsnorm_config(view.view, view.name, eps_key=self.eps_key))


@dataclass(frozen=True)
class WeightlessRMSNorms(Part):
    """One weightless RMSNorm (eps from ``eps_key``) in every place: the blocks, the final norm, the token embeddings
    (``model.embedding_norm``) and each head's queries and keys (nanochat's ``NanoChatRMSNorm``, which learns nothing).
    """

    eps_key: str = "rms_norm_eps"

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        norm = {"kind": "rmsnorm", "eps": cfg.get_float(self.eps_key), "weight": False}
        model["embedding_norm"] = dict(norm)
        block = model.setdefault("block", {})
        block["norm"] = dict(norm)
        block.setdefault("mixer", {}).update(qk_norm=dict(norm), qk_norm_scope="head")

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        view.block_kind("norm", ("rmsnorm",))
        if view.uniform("norm", "weight"):
            raise NotExpressible("model.block.norm.weight", f"Hugging Face {view.name}'s RMSNorms learn no weight "
                                 "(weight: false)")
        if view.model.embedding_norm is None:
            raise NotExpressible("model.embedding_norm", f"Hugging Face {view.name} normalises the token embeddings "
                                 "(embedding_norm: {kind: rmsnorm, weight: false})")
        if view.uniform("mixer", "qk_norm") is None:
            raise NotExpressible("model.block.mixer.qk_norm", f"Hugging Face {view.name} always normalises queries "
                                 "and keys (qk_norm: {kind: rmsnorm, weight: false})")
        # Any other eps, scope or weight on the final, embedding or q/k norms reads back otherwise: export names it.
        config[self.eps_key] = view.uniform("norm", "eps")


@dataclass(frozen=True)
class LayerNorm(Part):
    """LayerNorm everywhere, eps from ``eps_key``, with a bias (the final norm's too) unless ``bias`` is False (Cohere).

    ``offset`` 1: the scale is stored as ``w`` and applied as ``1 + w`` (Nemotron's LayerNorm1P).
    ``affine`` False: neither weight nor bias (OLMo's non-parametric LayerNorm). ``eps``: the one
    eps the family always uses, no config field holding it (OLMo's 1e-5); ``eps_key`` is then not read.
    """

    eps_key: str = "layer_norm_eps"
    bias: bool = True
    offset: float = 0.0
    affine: bool = True
    eps: float | None = None

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        eps = self.eps if self.eps is not None else cfg.get_float(self.eps_key)
        norm: dict[str, Any] = {"kind": "layernorm", "eps": eps}
        if not self.affine:
            norm["affine"] = False
        elif not self.bias:
            norm["bias"] = False
        if self.offset:
            norm["offset"] = self.offset
        model.setdefault("block", {})["norm"] = norm

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        view.block_kind("norm", ("layernorm",))
        affine = view.uniform("norm", "affine")
        if affine != self.affine or (affine and view.uniform("norm", "bias") != self.bias):
            has = ("no weight and no bias" if not self.affine else "a weight and a bias" if self.bias
                   else "a weight and no bias")
            raise NotExpressible("model.block.norm", f"Hugging Face {view.name}'s LayerNorms have {has}")
        if self.affine and view.uniform("norm", "offset") != self.offset:
            raise NotExpressible("model.block.norm.offset", f"Hugging Face {view.name}'s LayerNorms scale by "
                                 + ("1 + weight (offset: 1)" if self.offset else "their weight (offset: 0)"))
        eps = view.uniform("norm", "eps")
        if self.eps is None:
            config[self.eps_key] = eps
        elif eps != self.eps:
            raise NotExpressible("model.block.norm.eps", f"{eps}: Hugging Face {view.name}'s LayerNorms always use "
                                 f"eps {self.eps}")

    def rules(self) -> list[Rule]:
        return [Copy("model.norm.bias", "final_norm.bias")] if self.affine and self.bias else []


__all__ = ["LAYOUT_NORMS", "LayerNorm", "Layout", "RMSNorm", "WeightlessRMSNorms", "rmsnorm", "rmsnorm_config"]
