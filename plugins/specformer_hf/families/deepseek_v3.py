"""DeepSeek-V3 (``model_type: deepseek_v3``): multi-head latent attention, sigmoid-scored experts picked per group
with a selection-only bias, always-on shared experts, and dense first layers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer_hf.config import ConfigReader
from specformer_hf.families.common import (ATTN, FamilyView, GroupedExperts, Layout, Part, RMSNorm, Sizes, decoder_family,
                                           rope, rope_parameters_of)
from specformer_hf.rules import Copy, Rule
from specformer_hf.specview import NotExpressible

#: transformers' DeepseekV3Config defaults.
DEFAULTS = {
    "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1,
    "n_routed_experts": 256, "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 8, "topk_group": 4,
    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "norm_topk_prob": True, "hidden_act": "silu",
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "rope_interleave": True,
    "attention_bias": False, "num_mtp_layers": 1, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}
#: DeepseekV3RMSNorm's own eps, which the latent norms use (the config's rms_norm_eps is for the block norms).
LATENT_EPS = 1e-6


@dataclass(frozen=True)
class LatentRope(Part):
    """rope_parameters (with YaRN's mscale_all_dim also scaling the scores) and rope_interleave <-> the rope of
    the latent attention's rotary channels."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        positional = rope(cfg)
        positional["interleaved"] = bool(cfg.get("rope_interleave"))
        model["positional"] = positional

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        view.view.one_positional(family=view.name)
        pos = dict(view.positional)
        interleaved = bool(pos.pop("interleaved", False))
        params = rope_parameters_of({**pos, "interleaved": False}, view.name, path="model.positional",
                                    context_length=view.model.context_length)
        config.update(rope_parameters=params, rope_interleave=interleaved)


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
        model.setdefault("block", {})["attention"] = attention

    #: Whether the family's attention has DeepSeek Sparse Attention's indexer (DeepSeek-V3.2) or none (V2, V3).
    indexed: bool = False

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        view.block_kind("attention", ("mla",))
        a = view.uniform("attention")
        if (a.get("indexer") is not None) != self.indexed:
            raise NotExpressible("model.block.attention.indexer", f"Hugging Face {view.name}'s latent attention has "
                                 f"{'an' if self.indexed else 'no'} indexer")
        if a["latent_norm"].get("kind") != "rmsnorm" or a["latent_norm"].get("eps") != LATENT_EPS or a["window"] is not None:
            raise NotExpressible("model.block.attention", f"Hugging Face {view.name}'s latent attention has RMSNorm "
                                 f"latents (eps {LATENT_EPS}) and no window")
        config.update(num_attention_heads=a["n_heads"], num_key_value_heads=a["n_heads"], kv_lora_rank=a["kv_lora_rank"],
                      qk_rope_head_dim=a["qk_rope_head_dim"], qk_nope_head_dim=a["qk_nope_head_dim"],
                      v_head_dim=a["v_head_dim"], q_lora_rank=a["q_lora_rank"], attention_bias=a["bias"])

    def rules(self) -> list[Rule]:
        pairs = [("q_proj", "q_proj"), ("q_a_proj", "q_a"), ("q_b_proj", "q_b"), ("kv_a_proj_with_mqa", "kv_a"),
                 ("kv_b_proj", "kv_b"), ("o_proj", "out")]
        rules: list[Rule] = [Copy(f"{ATTN}.{hf}.{p}", f"blocks.{{i}}.attention.{ours}.{p}") for hf, ours in pairs
                             for p in ("weight", "bias")]
        return rules + [Copy(f"{ATTN}.q_a_layernorm.weight", "blocks.{i}.attention.q_norm.weight"),
                        Copy(f"{ATTN}.kv_a_layernorm.weight", "blocks.{i}.attention.kv_norm.weight")]


FAMILY = decoder_family(
    name="DeepSeek-V3",
    model_type="deepseek_v3",
    architecture="DeepseekV3ForCausalLM",
    defaults=DEFAULTS,
    parts=[Sizes(), LatentRope(), Layout("prenorm"), RMSNorm(), LatentAttention(), GroupedExperts()],
    maps="attention mla (q_lora_rank, kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim, attention_bias; YaRN "
         "mscale_all_dim on the scores), rope_interleave -> interleaved rope, ffn moe with router sigmoid_topk "
         "(norm_topk_prob, routed_scaling_factor, n_group, topk_group; e_score_correction_bias -> selection_bias), "
         "n_shared_experts, first_k_dense_replace -> dense layers",
    caveats="the multi-token-prediction layer of the published checkpoints (model.layers.61) is skipped, as transformers "
            "skips it; aux_loss_coef is 0 on import",
    # The published 61-layer checkpoints store their multi-token-prediction module as layer 61; transformers'
    # DeepseekV3PreTrainedModel ignores exactly these tensors (_keys_to_ignore_on_load_unexpected), and so does import.
    ignore_tensors=(r"model\.layers\.61\..*",),
)
