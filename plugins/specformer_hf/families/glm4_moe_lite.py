"""GLM-4.7-Flash (``model_type: glm4_moe_lite``): DeepSeek-V3's multi-head latent attention and interleaved rope over
GLM-4.5's sigmoid-routed experts, each layer dense or sparse as mlp_layer_types says."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer_hf.config import ConfigReader
from specformer_hf.families.deepseek_v3 import LatentRope
from specformer_hf.families.deepseek_v32 import LayerTypedExperts
from specformer_hf.parts.attention import LatentAttention
from specformer_hf.parts.base import FamilyView
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.mtp import LayerMTP
from specformer_hf.parts.norms import Layout, RMSNorm

#: transformers' Glm4MoeLiteConfig defaults (GLM-4.7-Flash's sizes).
DEFAULTS = {
    "vocab_size": 154880, "hidden_size": 2048, "intermediate_size": 10240, "moe_intermediate_size": 1536,
    "num_hidden_layers": 47, "num_attention_heads": 20, "num_key_value_heads": 20, "n_shared_experts": 1,
    "n_routed_experts": 64, "routed_scaling_factor": 1.8, "kv_lora_rank": 512, "q_lora_rank": 768,
    "qk_rope_head_dim": 64, "v_head_dim": 256, "qk_nope_head_dim": 192, "n_group": 1, "topk_group": 1,
    "num_experts_per_tok": 4, "norm_topk_prob": True, "hidden_act": "silu", "max_position_embeddings": 202752,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "rope_interleave": True, "mlp_layer_types": None,
    "attention_bias": False, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


@dataclass(frozen=True)
class LiteExperts(LayerTypedExperts):
    """DeepSeek-V3's experts, the dense layers named by mlp_layer_types alone: Glm4MoeLiteConfig has no
    first_k_dense_replace, and without mlp_layer_types only the first layer is dense."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        if cfg.data.get("mlp_layer_types") is None:
            if cfg.data.get("first_k_dense_replace", 1) != 1:
                cfg.note_unused("first_k_dense_replace (transformers' GLM-4.7-Flash makes only the first layer dense "
                                "unless mlp_layer_types says otherwise)")
            cfg.data["first_k_dense_replace"] = 1
        super().read(cfg, model)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        super().write(view, config)
        del config["first_k_dense_replace"]


FAMILY = decoder_family(
    name="GLM-4.7-Flash",
    model_type="glm4_moe_lite",
    architecture="Glm4MoeLiteForCausalLM",
    defaults=DEFAULTS,
    parts=(Sizes(), LatentRope(), Layout("prenorm"), RMSNorm(), LatentAttention(), LiteExperts(), LayerMTP()),
    maps="as DeepSeek-V3: attention mla (q_lora_rank, kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim, "
         "attention_bias; YaRN mscale_all_dim on the scores), rope_interleave -> interleaved rope, ffn moe with router "
         "sigmoid_topk (norm_topk_prob, routed_scaling_factor, n_group, topk_group; e_score_correction_bias -> "
         "selection_bias), n_shared_experts; mlp_layer_types (default: the first layer dense) -> dense layers; "
         "num_nextn_predict_layers -> mtp depths as DeepSeek-V3's (model.layers.47: enorm, hnorm, eh_proj, "
         "shared_head.norm and a decoder layer)",
    caveats="dense layers must come first in mlp_layer_types; a file without the multi-token-prediction layers its "
            "config counts (transformers' save_pretrained leaves them out) imports without model.mtp, with a note; "
            "aux_loss_coef is 0 on import",
    # transformers' Glm4MoeLitePreTrainedModel ignores exactly these tensors (_keys_to_ignore_on_load_unexpected), and
    # its config has no num_nextn_predict_layers (the published config.json has it); import reads them as model.mtp,
    # and skips them only where config.json counts no MTP layer.
    ignore_tensors=(r"model\.layers\.47\..*",),
)
