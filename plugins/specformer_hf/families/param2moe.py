"""Param2 (``model_type: param2moe``, Param2-17B-A2.4B): transformers builds Glm4MoeForCausalLM from Param2MoeConfig,
GLM-4.5 with whole heads rotated, q/k norms on and the original config.json's names for the experts and biases."""

from __future__ import annotations

from specformer_hf.families import glm4_moe
from specformer_hf.families.glm4_moe_saved_names import saved_names_family

#: transformers' Param2MoeConfig defaults (Param2-17B-A2.4B's shapes): Glm4MoeConfig's, with these changed; its
#: rope turns whole heads unless config.json says otherwise (partial_rotary_factor 1.0, not GLM-4.5's 0.5).
DEFAULTS = {
    **glm4_moe.DEFAULTS, "vocab_size": 128000, "hidden_size": 2048, "intermediate_size": 9216, "num_hidden_layers": 21,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "moe_intermediate_size": 2048, "num_experts_per_tok": 6,
    "n_shared_experts": 2, "n_routed_experts": 64, "routed_scaling_factor": 2.5, "use_qk_norm": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0, "partial_rotary_factor": 1.0},
}

FAMILY = saved_names_family(name="Param2", model_type="param2moe", defaults=DEFAULTS)
