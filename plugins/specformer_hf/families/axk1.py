"""A.X-K1 (``model_type: axk1``, SK Telecom's skt/A.X-K1): DeepSeek-V3 (multi-head latent attention with a query
low-rank, grouped sigmoid-routed experts with a shared expert, dense layers by mlp_layer_types) with an RMSNorm on the
mixture's output.

The norm is the moe's ``output_norm`` (eps ``rms_norm_eps``), applied to the routed and shared
experts' sum before the residual add. Checkpoints store it beside the layer's norms
(``model.layers.i.post_mlp_layernorm``); transformers 5 holds it inside the mixture
(``mlp.post_mlp_layernorm``). Both are read; the checkpoint's name is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError

from specformer_hf.config import ConfigReader
from specformer_hf.families.deepseek_v3 import LatentRope
from specformer_hf.families.deepseek_v32 import LayerTypedExperts
from specformer_hf.parts.attention import LatentAttention
from specformer_hf.parts.base import LAYER, MLP, FamilyView
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.norms import Layout, RMSNorm
from specformer_hf.rules import Copy, OneOf, Rule
from specformer_hf.specview import NotExpressible

#: transformers' AXK1Config defaults (its docstring names skt/A.X-K1).
DEFAULTS = {
    "vocab_size": 163840, "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "num_hidden_layers": 61, "num_attention_heads": 64, "num_key_value_heads": 64, "n_shared_experts": 1,
    "n_routed_experts": 192, "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 8, "topk_group": 4,
    "num_experts_per_tok": 8, "norm_topk_prob": True, "hidden_act": "silu", "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "rope_interleave": True, "attention_bias": False,
    "mlp_layer_types": None, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


@dataclass(frozen=True)
class QueryLowRankAttention(LatentAttention):
    """DeepSeek-V3's latent attention where the query always goes through its low rank (AXK1Attention has no q_proj)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        if cfg.get("q_lora_rank") is None:
            raise UserError(f"{cfg.family}: q_lora_rank null is not supported: transformers' A.X-K1 attention always "
                            "projects queries through q_a_proj and q_b_proj; give q_lora_rank")
        super().read(cfg, model)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        super().write(view, config)
        if config.get("q_lora_rank") is None:
            raise NotExpressible("model.block.mixer.q_rank", f"Hugging Face {view.name}'s attention always has a query "
                                 "low rank (q_lora_rank)")


@dataclass(frozen=True)
class MlpLayerTypedExperts(LayerTypedExperts):
    """DeepSeek-V3's experts with dense layers by mlp_layer_types only (AXK1Config and AXK2Config keep no
    first_k_dense_replace; they build mlp_layer_types from it and moe_layer_freq when it is not given)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        if cfg.data.get("mlp_layer_types") is None:
            # The config builds mlp_layer_types from these keywords, and keeps neither (the first layer dense by default).
            dense, freq = cfg.get_int("first_k_dense_replace", 1), cfg.get_int("moe_layer_freq", 1)
            if freq != 1:
                raise UserError(f"{cfg.family}: moe_layer_freq {freq} is not supported: specformer's DeepSeek-style "
                                "experts come after the dense layers, in every later layer; supported: 1")
            n_layers = cfg.get_layers("num_hidden_layers")
            cfg.data["mlp_layer_types"] = ["dense" if i < dense else "sparse" for i in range(n_layers)]
        cfg.mark_read("first_k_dense_replace", "moe_layer_freq")
        super().read(cfg, model)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        super().write(view, config)
        del config["first_k_dense_replace"]  # the config has mlp_layer_types only


@dataclass(frozen=True)
class NormedExperts(MlpLayerTypedExperts):
    """DeepSeek-V3's experts (dense layers by mlp_layer_types only) with ``output_norm`` an RMSNorm of eps rms_norm_eps
    on every moe layer."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        super().read(cfg, model)
        norm = {"kind": "rmsnorm", "eps": cfg.get_float("rms_norm_eps")}
        model["block"]["ffn"]["output_norm"] = norm

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        super().write(view, config)
        eps = view.uniform("norm", "eps")
        for i, layer in enumerate(view.view.layers):
            if layer["ffn"]["kind"] != "moe":
                continue
            norm = layer["ffn"].get("output_norm") or {}
            if (norm.get("kind") != "rmsnorm" or norm.get("eps") != eps or not norm.get("weight", True)
                    or norm.get("offset", 0.0) != 0.0):
                raise NotExpressible(f"model.layers[{i}].ffn.output_norm", f"Hugging Face {view.name} normalises the "
                                     f"mixture's output with an RMSNorm of the block norms' eps ({{kind: rmsnorm, eps: {eps}}})")

    def rules(self) -> list[Rule]:
        ours = "blocks.{i}.ffn.output_norm.weight"
        return [*super().rules(),
                OneOf(Copy(f"{LAYER}.post_mlp_layernorm.weight", ours), Copy(f"{MLP}.post_mlp_layernorm.weight", ours))]


FAMILY = decoder_family(
    name="A.X-K1",
    model_type="axk1",
    architecture="AXK1ForCausalLM",
    defaults=DEFAULTS,
    parts=(Sizes(), LatentRope(), Layout("prenorm"), RMSNorm(), QueryLowRankAttention(), NormedExperts()),
    maps="as DeepSeek-V3: attention mla (q_lora_rank always, kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, "
         "v_head_dim, attention_bias), rope_interleave -> interleaved rope, ffn moe with router sigmoid_topk "
         "(norm_topk_prob, routed_scaling_factor, n_group, topk_group; e_score_correction_bias -> selection_bias), "
         "n_shared_experts; mlp_layer_types -> dense layers; post_mlp_layernorm -> the moe's output_norm (RMSNorm, "
         "rms_norm_eps)",
    caveats="dense layers must come first in mlp_layer_types; q_lora_rank must be set; aux_loss_coef is 0 on import",
)
