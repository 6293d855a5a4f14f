"""Sarvam-30B (``model_type: sarvam_moe``): transformers builds Glm4MoeForCausalLM from SarvamMoEConfig,
GLM-4.5 with whole heads rotated, q/k norms on and the original config.json's names for the experts and biases."""

from __future__ import annotations

from specformer_hf.families import glm4_moe
from specformer_hf.families.glm4_moe_saved_names import saved_rules
from specformer_hf.parts.base import SavedNames
from specformer_hf.parts.decoder import decoder_family

#: transformers' SarvamMoEConfig defaults (Sarvam-30B's shapes): Glm4MoeConfig's, with these changed; its
#: rope turns whole heads unless config.json says otherwise (partial_rotary_factor 1.0, not GLM-4.5's 0.5).
DEFAULTS = {
    **glm4_moe.DEFAULTS, "vocab_size": 262144, "intermediate_size": 8192, "num_hidden_layers": 19,
    "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 64, "rms_norm_eps": 1e-6,
    "moe_intermediate_size": 1024, "num_experts_per_tok": 6, "routed_scaling_factor": 2.5, "use_qk_norm": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 8000000.0, "partial_rotary_factor": 1.0},
}

#: SarvamMoEConfig's attribute_map: the names the original sarvamai/sarvam-30b config.json uses.
SAVED_NAMES = (("num_experts", "n_routed_experts"), ("num_shared_experts", "n_shared_experts"),
               ("use_qkv_bias", "attention_bias"))

FAMILY = decoder_family(
    name="Sarvam-30B",
    model_type="sarvam_moe",
    architecture="Glm4MoeForCausalLM",
    defaults=DEFAULTS,
    parts=[SavedNames(SAVED_NAMES), *glm4_moe.PARTS],
    rules=saved_rules(),
    ignore_tensors=glm4_moe.FAMILY.ignore_tensors,
    maps="as GLM-4.5 (transformers builds Glm4MoeForCausalLM): partial_rotary_factor (default 1.0: whole heads), "
         "use_qk_norm (default on), q/k/v biases, sigmoid-routed experts, shared experts, dense first layers; "
         "num_experts, num_shared_experts, use_qkv_bias read as n_routed_experts, n_shared_experts, attention_bias; the tensors under the original names "
         "(model.word_embeddings, attention.query_key_value fused, attention.dense, attention.query_layernorm / "
         "key_layernorm, mlp.gate.expert_bias)",
    caveats="as GLM-4.5; export writes GLM-4.5's field names and the original tensor names, as transformers' "
            "save_pretrained does",
)
