"""Softmax attention: its sizes, the q/k/v and output projections, q/k norms, the score scale; latent attention."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from specformer_hf.config import ConfigReader
from specformer_hf.parts.base import ATTN, BLOCK_MIXER, FamilyView, Part
from specformer_hf.parts.norms import rmsnorm
from specformer_hf.rules import Copy, Fused, Rule, qkv_sizes
from specformer_hf.specview import NotExpressible, SpecView


def attention_sizes(cfg: ConfigReader) -> dict[str, Any]:
    """n_heads, n_kv_heads, head_dim of the attention (head_dim: null means hidden / heads)."""
    n_heads = cfg.get_size("num_attention_heads")
    n_kv = cfg.get("num_key_value_heads", None) or n_heads
    head_dim = cfg.get("head_dim", None) or cfg.get_size("hidden_size") // n_heads
    return {"kind": "attention", "n_heads": n_heads, "n_kv_heads": n_kv, "head_dim": head_dim}


def attention_sizes_config(view: SpecView, family: str) -> dict[str, Any]:
    view.block_kind("mixer", ("attention",), family=family)
    for key in ("n_heads", "n_kv_heads", "head_dim"):
        view.uniform("mixer", key, family=family)
    n_heads, n_kv, head_dim = view.attention_sizes()
    return {"num_attention_heads": n_heads, "num_key_value_heads": n_kv, "head_dim": head_dim}


@dataclass(frozen=True)
class Attention(Part):
    """num_attention_heads, num_key_value_heads, head_dim; q/k/v fused into our qkv, o_proj, their biases.

    ``head_dim`` False: the family's attention always uses hidden_size / num_attention_heads
    (StableLM), whatever a head_dim field says.
    """

    head_dim: bool = True

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        sizes = attention_sizes(cfg)
        if not self.head_dim:
            sizes["head_dim"] = cfg.get_size("hidden_size") // sizes["n_heads"]
        model.setdefault("block", {}).setdefault("mixer", {}).update(sizes)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        sizes = attention_sizes_config(view.view, view.name)
        if not self.head_dim:
            if sizes["head_dim"] * sizes["num_attention_heads"] != view.model.d_model:
                raise NotExpressible("model.block.mixer.head_dim", f"Hugging Face {view.name} has head_dim = "
                                     f"d_model / n_heads ({view.model.d_model} / {sizes['num_attention_heads']})")
            del sizes["head_dim"]
        config.update(sizes)

    def rules(self) -> list[Rule]:
        return [
            Fused([f"{ATTN}.q_proj.weight", f"{ATTN}.k_proj.weight", f"{ATTN}.v_proj.weight"],
                  f"{BLOCK_MIXER}.qkv.weight", sizes=qkv_sizes),
            Fused([f"{ATTN}.q_proj.bias", f"{ATTN}.k_proj.bias", f"{ATTN}.v_proj.bias"],
                  f"{BLOCK_MIXER}.qkv.bias", sizes=qkv_sizes),
            Copy(f"{ATTN}.o_proj.weight", f"{BLOCK_MIXER}.out.weight"),
            Copy(f"{ATTN}.o_proj.bias", f"{BLOCK_MIXER}.out.bias"),
        ]


@dataclass(frozen=True)
class ClipQKV(Part):
    """clip_qkv (null: no clamping) <-> the attention's clip_qkv; ``order`` where the family clamps queries and keys,
    our ``clip_qkv_order`` (after_qk_norm: after their norm over all heads, OLMoE)."""

    order: str = "after_projection"

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        if cfg.get("clip_qkv") is None:
            return
        attention = model.setdefault("block", {}).setdefault("mixer", {})
        attention["clip_qkv"] = cfg.get_float("clip_qkv")
        if self.order != "after_projection":
            attention["clip_qkv_order"] = self.order

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        clip = view.uniform("mixer", "clip_qkv")
        if clip is not None and view.uniform("mixer", "clip_qkv_order") != self.order:
            raise NotExpressible("model.block.mixer.clip_qkv_order", f"Hugging Face {view.name} clamps queries and keys "
                                 f"{self.order.replace('_', ' ')} (clip_qkv_order: {self.order})")
        config["clip_qkv"] = clip


@dataclass(frozen=True)
class QKNorm(Part):
    """RMSNorm on queries and keys (eps rms_norm_eps): per head (Qwen3) or over all heads (OLMo-2).

    Always on, unless ``switch`` names a boolean config field that turns it on (GLM-4.5's use_qk_norm).
    ``order`` ``after_rope``: the family normalises the rotated heads (Hunyuan-V1), our ``qk_norm_order``.
    """

    scope: str = "head"
    eps_key: str = "rms_norm_eps"
    #: 1 for Gemma 3's (1 + w) weights.
    offset: float = 0.0
    switch: str | None = None
    order: str = "before_rope"
    #: The checkpoint's names of the query and key norms under self_attn (Hunyuan-V1: query_layernorm, key_layernorm).
    names: tuple[str, str] = ("q_norm", "k_norm")

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        if self.switch and not cfg.get(self.switch):
            return
        attention = model.setdefault("block", {}).setdefault("mixer", {})
        attention.update(qk_norm=rmsnorm(cfg, eps_key=self.eps_key, offset=self.offset), qk_norm_scope=self.scope)
        if self.order != "before_rope":
            attention["qk_norm_order"] = self.order

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        on = view.uniform("mixer", "qk_norm") is not None
        if on and view.uniform("mixer", "qk_norm_order") != self.order:
            raise NotExpressible("model.block.mixer.qk_norm_order", f"Hugging Face {view.name} normalises queries and "
                                 f"keys {self.order.replace('_', ' ')} (qk_norm_order: {self.order})")
        if self.switch:
            config[self.switch] = on
        elif not on:
            raise NotExpressible("model.block.mixer.qk_norm", f"Hugging Face {view.name} always normalises queries and keys (qk_norm: rmsnorm)")

    def rules(self) -> list[Rule]:
        q, k = self.names
        return [Copy(f"{ATTN}.{q}.weight", f"{BLOCK_MIXER}.q_norm.weight"),
                Copy(f"{ATTN}.{k}.weight", f"{BLOCK_MIXER}.k_norm.weight")]


#: transformers' DiffLlama initialises its lambda vectors from N(0, lambda_std_dev); ours from N(0, 0.1) (the paper's).
DIFFERENTIAL_LAMBDA_STD = 0.1


@dataclass(frozen=True)
class Differential(Part):
    """Differential attention (DiffLlama) <-> attention ``differential``: each pair's output normalised by an RMSNorm
    without a weight of eps ``rms_norm_eps`` (the block norms' field), the four lambda vectors under self_attn.
    ``lambda_std_dev`` (their init spread) is read and ignored; export writes 0.1, the spread ours start from."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        cfg.get("lambda_std_dev", None)  # initialisation only
        norm = {"kind": "rmsnorm", "eps": cfg.get_float("rms_norm_eps"), "weight": False}
        model.setdefault("block", {}).setdefault("mixer", {}).update(differential=True, differential_norm=norm)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        if not view.uniform("mixer", "differential"):
            raise NotExpressible("model.block.mixer.differential",
                                 f"Hugging Face {view.name} attention is always differential (differential: true)")
        norm = view.uniform("mixer", "differential_norm")
        eps = config.get("rms_norm_eps")
        if (norm.get("kind") != "rmsnorm" or norm.get("weight", True) or norm.get("offset", 0.0)
                or norm.get("eps") != eps):
            raise NotExpressible("model.block.mixer.differential_norm",
                                 f"Hugging Face {view.name} normalises each head pair with an RMSNorm without a weight "
                                 f"whose eps is the block norms' (rms_norm_eps {eps}): "
                                 f"{{kind: rmsnorm, weight: false, eps: {eps}}}")
        config["lambda_std_dev"] = DIFFERENTIAL_LAMBDA_STD

    def rules(self) -> list[Rule]:
        return [Copy(f"{ATTN}.lambda_{name}", f"{BLOCK_MIXER}.differential.lambda_{name}")
                for name in ("q1", "k1", "q2", "k2")]


@dataclass(frozen=True)
class QueryScale(Part):
    """query_pre_attn_scalar s: scores scaled by s^-1/2 instead of head_dim^-1/2 (Gemma 2 and 3)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        attention = model.setdefault("block", {}).setdefault("mixer", {})
        scalar = cfg.get_float("query_pre_attn_scalar")
        if scalar != attention["head_dim"]:
            attention["scale"] = scalar ** -0.5

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        _, _, head_dim = view.attention_sizes()
        scale = view.uniform("mixer", "scale")
        scalar: float = head_dim
        if scale is not None:
            scalar = scale ** -2
            if math.isclose(scalar, round(scalar), rel_tol=1e-9):
                scalar = int(round(scalar))
        config["query_pre_attn_scalar"] = scalar


# -- multi-head latent attention (DeepSeek-V3, V3.2, Kimi Linear) ----------------------------------------

#: DeepseekV3RMSNorm's own eps, which the latent norms use (the config's rms_norm_eps is for the block norms).
LATENT_EPS = 1e-6


@dataclass(frozen=True)
class LatentAttention(Part):
    """num_attention_heads, q_lora_rank, kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim, attention_bias
    <-> attention ``mla``; the q_a/q_b (or q), kv_a, kv_b and o projections and the two latent norms."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        attention: dict[str, Any] = {
            "kind": "mla",
            "n_heads": cfg.get_size("num_attention_heads"),
            "kv_lora_rank": cfg.get_size("kv_lora_rank"),
            "qk_rope_head_dim": cfg.get_size("qk_rope_head_dim"),
            "qk_nope_head_dim": cfg.get_int("qk_nope_head_dim"),
            "v_head_dim": cfg.get_size("v_head_dim"),
            "q_lora_rank": cfg.get("q_lora_rank"),
            "latent_norm": {"kind": "rmsnorm", "eps": LATENT_EPS},
            "bias": bool(cfg.get("attention_bias")),
        }
        # Every head has its own key and value from the latent; head_dim and qk_head_dim are derived sizes.
        cfg.mark_read("num_key_value_heads", "head_dim", "qk_head_dim")
        scaling = model["positional"].get("scaling") or {}
        if scaling.get("kind") == "yarn" and scaling.get("mscale_all_dim"):
            attention.update(yarn_factor=scaling["factor"], yarn_mscale_all_dim=scaling["mscale_all_dim"])
        model.setdefault("block", {})["mixer"] = attention

    #: Whether the family's attention has DeepSeek Sparse Attention's indexer (DeepSeek-V3.2) or none (V2, V3).
    indexed: bool = False

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        view.block_kind("mixer", ("mla",))
        a = view.uniform("mixer")
        if (a.get("indexer") is not None) != self.indexed:
            raise NotExpressible("model.block.mixer.indexer", f"Hugging Face {view.name}'s latent attention has "
                                 f"{'an' if self.indexed else 'no'} indexer")
        if a["latent_norm"].get("kind") != "rmsnorm" or a["latent_norm"].get("eps") != LATENT_EPS or a["window"] is not None:
            raise NotExpressible("model.block.mixer", f"Hugging Face {view.name}'s latent attention has RMSNorm "
                                 f"latents (eps {LATENT_EPS}) and no window")
        config.update(num_attention_heads=a["n_heads"], num_key_value_heads=a["n_heads"], kv_lora_rank=a["kv_lora_rank"],
                      qk_rope_head_dim=a["qk_rope_head_dim"], qk_nope_head_dim=a["qk_nope_head_dim"],
                      v_head_dim=a["v_head_dim"], q_lora_rank=a["q_lora_rank"], attention_bias=a["bias"])

    def rules(self) -> list[Rule]:
        pairs = [("q_proj", "q_proj"), ("q_a_proj", "q_a"), ("q_b_proj", "q_b"), ("kv_a_proj_with_mqa", "kv_a"),
                 ("kv_b_proj", "kv_b"), ("o_proj", "out")]
        rules: list[Rule] = [Copy(f"{ATTN}.{hf}.{p}", f"{BLOCK_MIXER}.{ours}.{p}") for hf, ours in pairs
                             for p in ("weight", "bias")]
        return rules + [Copy(f"{ATTN}.q_a_layernorm.weight", f"{BLOCK_MIXER}.q_norm.weight"),
                        Copy(f"{ATTN}.kv_a_layernorm.weight", f"{BLOCK_MIXER}.kv_norm.weight")]


__all__ = ["Attention", "LATENT_EPS", "LatentAttention", "QKNorm", "QueryScale", "attention_sizes", "attention_sizes_config"]
