"""Param2 (``model_type: param2moe``, Param2-17B-A2.4B): transformers builds Glm4MoeForCausalLM from Param2MoeConfig,
GLM-4.5 with whole heads rotated, q/k norms on and the original config.json's names for the experts and biases."""

from __future__ import annotations

from specformer_hf.families import glm4_moe
from specformer_hf.families.glm4_moe_saved_names import saved_rules
from specformer_hf.parts.base import SavedNames
from specformer_hf.parts.decoder import decoder_family

#: transformers' Param2MoeConfig defaults (Param2-17B-A2.4B's shapes): Glm4MoeConfig's, with these changed; its
#: rope turns whole heads unless config.json says otherwise (partial_rotary_factor 1.0, not GLM-4.5's 0.5).
DEFAULTS = {
    **glm4_moe.DEFAULTS, "vocab_size": 128000, "hidden_size": 2048, "intermediate_size": 9216, "num_hidden_layers": 21,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "moe_intermediate_size": 2048, "num_experts_per_tok": 6,
    "n_shared_experts": 2, "n_routed_experts": 64, "routed_scaling_factor": 2.5, "use_qk_norm": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0, "partial_rotary_factor": 1.0},
}

#: Param2MoeConfig's attribute_map: the names the original bharatgenai config.json files use.
SAVED_NAMES = (("num_experts", "n_routed_experts"), ("num_shared_experts", "n_shared_experts"),
               ("use_qkv_bias", "attention_bias"))

FAMILY = decoder_family(
    name="Param2",
    model_type="param2moe",
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
