"""Sarvam-30B (``model_type: sarvam_moe``): transformers builds Glm4MoeForCausalLM from SarvamMoEConfig,
GLM-4.5 with whole heads rotated, q/k norms on and the original config.json's names for the experts and biases."""

from __future__ import annotations

from specformer_hf.families import glm4_moe
from specformer_hf.families.glm4_moe_saved_names import saved_names_family

#: transformers' SarvamMoEConfig defaults (Sarvam-30B's shapes): Glm4MoeConfig's, with these changed; its
#: rope turns whole heads unless config.json says otherwise (partial_rotary_factor 1.0, not GLM-4.5's 0.5).
DEFAULTS = {
    **glm4_moe.DEFAULTS, "vocab_size": 262144, "intermediate_size": 8192, "num_hidden_layers": 19,
    "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 64, "rms_norm_eps": 1e-6,
    "moe_intermediate_size": 1024, "num_experts_per_tok": 6, "routed_scaling_factor": 2.5, "use_qk_norm": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 8000000.0, "partial_rotary_factor": 1.0},
}

FAMILY = saved_names_family(name="Sarvam-30B", model_type="sarvam_moe", defaults=DEFAULTS)
