"""Qwen3.5-MoE text (``model_type: qwen3_5_moe_text``, ``Qwen3_5MoeForCausalLM``, Qwen3.5-35B-A3B): Qwen3.5's hybrid
layers with routed experts (top-k weights always renormalised) and a gated shared expert in every layer."""

from __future__ import annotations

from specformer_hf.parts.decoder import decoder_family, language_model_of
from specformer_hf.parts.deltanet import (AttentionFields, DeltaNetFields, HybridMixers, gated_attention_rules,
                                          qwen3_5_delta_rules, qwen_default_types)
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.feedforward import MixtureOfExperts
from specformer_hf.parts.mtp import SEPARATE_LAYER, SeparateMTP
from specformer_hf.parts.norms import Layout, RMSNorm
from specformer_hf.parts.positions import TextRope

#: transformers' Qwen3_5MoeTextConfig defaults.
DEFAULTS = {
    "vocab_size": 248320, "hidden_size": 2048, "num_hidden_layers": 40, "num_attention_heads": 16,
    "num_key_value_heads": 2, "hidden_act": "silu", "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False, "attention_bias": False, "head_dim": 256, "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
    "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "num_experts_per_tok": 8, "num_experts": 256,
    "router_aux_loss_coef": 0.001, "layer_types": None,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
}

FAMILY = decoder_family(
    name="Qwen3.5-MoE",
    model_type="qwen3_5_moe_text",
    architecture="Qwen3_5MoeForCausalLM",
    defaults=DEFAULTS,
    parts=[
        Sizes(), TextRope(partial=True, write_fraction=True), Layout("prenorm"), RMSNorm(offset=1.0),
        MixtureOfExperts(hidden="moe_intermediate_size", shared=True),
        HybridMixers(DeltaNetFields(), AttentionFields(gated=True), qwen_default_types),
        SeparateMTP(AttentionFields(gated=True)),
    ],
    extra_rules=[*qwen3_5_delta_rules(), *gated_attention_rules()],
    mtp_layer=SEPARATE_LAYER,
    ignore_tensors=(r"mtp\..*", r"model\.visual\..*"),
    maps="as Qwen3.5 with ffn moe in every layer: num_experts, num_experts_per_tok, moe_intermediate_size (top-k "
         "weights always renormalised), one shared expert (shared_expert_intermediate_size) gated by "
         "sigmoid(shared_expert_gate); mtp_num_hidden_layers (0 or 1) -> mtp depths as Qwen3-Next's",
    non_math_fields=("intermediate_size",),  # transformers keeps it out of Qwen3.5-MoE (every layer has experts)
    caveats="text only (model_type qwen3_5_moe_text, Qwen3_5MoeForCausalLM); reads per-expert and fused 3-D expert "
            "tensors, writes per-expert; mrope_section dropped; a file without the MTP layer its config counts "
            "imports without model.mtp, with a note",
)

#: The published checkpoints: the multimodal model's config.json and weights, read for its language model.
MULTIMODAL = language_model_of(FAMILY, name="Qwen3.5-MoE (multimodal)", model_type="qwen3_5_moe", architecture="Qwen3_5MoeForConditionalGeneration")
