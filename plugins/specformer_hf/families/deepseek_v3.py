"""DeepSeek-V3 (``model_type: deepseek_v3``): multi-head latent attention, sigmoid-scored experts picked per group
with a selection-only bias, always-on shared experts, and dense first layers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer_hf.config import ConfigReader
from specformer_hf.parts.attention import LatentAttention
from specformer_hf.parts.base import FamilyView, Part
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.feedforward import GroupedExperts
from specformer_hf.parts.mtp import LayerMTP
from specformer_hf.parts.norms import Layout, RMSNorm
from specformer_hf.parts.positions import rope, rope_parameters_of

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


#: The table, which the families transformers runs as DeepSeek-V3 (Sarvam-105B) reuse.
PARTS = (Sizes(), LatentRope(), Layout("prenorm"), RMSNorm(), LatentAttention(), GroupedExperts(), LayerMTP())

FAMILY = decoder_family(
    name="DeepSeek-V3",
    model_type="deepseek_v3",
    architecture="DeepseekV3ForCausalLM",
    defaults=DEFAULTS,
    parts=PARTS,
    maps="attention mla (q_lora_rank, kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim, attention_bias; YaRN "
         "mscale_all_dim on the scores), rope_interleave -> interleaved rope, ffn moe with router sigmoid_topk "
         "(norm_topk_prob, routed_scaling_factor, n_group, topk_group; e_score_correction_bias -> selection_bias), "
         "n_shared_experts, first_k_dense_replace -> dense layers, num_nextn_predict_layers -> mtp depths (model.layers.N+k-1: "
         "enorm, hnorm, eh_proj, shared_head.norm and a decoder layer)",
    caveats="a file without the multi-token-prediction layers its config counts (transformers' save_pretrained leaves "
            "them out) imports without model.mtp, with a note; aux_loss_coef is 0 on import",
    # transformers' DeepseekV3PreTrainedModel ignores the 61-layer checkpoints' MTP layer 61 when it loads; import
    # reads it as model.mtp, and skips it only where config.json counts no MTP layer (no rule used the tensors).
    ignore_tensors=(r"model\.layers\.61\..*",),
)
