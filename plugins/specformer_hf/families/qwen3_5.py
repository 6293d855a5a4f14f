"""Qwen3.5 text (``model_type: qwen3_5_text``, ``Qwen3_5ForCausalLM``): Qwen3-Next's hybrid layers with separate
q/k/v, z, b and a projections in the Gated DeltaNet, and a dense SwiGLU in every layer."""

from __future__ import annotations

from specformer_hf.parts.decoder import decoder_family, language_model_of
from specformer_hf.parts.deltanet import (AttentionFields, DeltaNetFields, HybridMixers, gated_attention_rules,
                                          qwen3_5_delta_rules, qwen_default_types)
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.feedforward import GatedFFN
from specformer_hf.parts.mtp import SEPARATE_LAYER, SeparateMTP
from specformer_hf.parts.norms import Layout, RMSNorm
from specformer_hf.parts.positions import TextRope

#: transformers' Qwen3_5TextConfig defaults (partial_rotary_factor 0.25 in the rope parameters, as Qwen3-Next).
DEFAULTS = {
    "vocab_size": 248320, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 32,
    "num_attention_heads": 16, "num_key_value_heads": 4, "hidden_act": "silu", "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False, "head_dim": 256,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "layer_types": None,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
}

FAMILY = decoder_family(
    name="Qwen3.5",
    model_type="qwen3_5_text",
    architecture="Qwen3_5ForCausalLM",
    defaults=DEFAULTS,
    parts=[
        Sizes(), TextRope(partial=True, write_fraction=True), Layout("prenorm"), RMSNorm(offset=1.0), GatedFFN(),
        HybridMixers(DeltaNetFields(), AttentionFields(gated=True), qwen_default_types),
        SeparateMTP(AttentionFields(gated=True)),
    ],
    extra_rules=[*qwen3_5_delta_rules(), *gated_attention_rules()],
    mtp_layer=SEPARATE_LAYER,
    ignore_tensors=(r"mtp\..*", r"model\.visual\..*"),
    maps="as Qwen3-Next (layer_types, the linear_* fields, gated attention, (1 + w) RMSNorm, partial rotary) with a "
         "dense SwiGLU (intermediate_size) in every layer; mtp_num_hidden_layers (0 or 1) -> mtp depths as Qwen3-Next's",
    caveats="the language model as Qwen3_5ForCausalLM saves it (the published multimodal checkpoints: qwen3_5); the "
            "multimodal rope sections (mrope_section) are dropped, as they turn text positions like a plain rope; "
            "model.visual.* is skipped, as transformers skips it; a file without the MTP layer its config counts imports "
            "without model.mtp, with a note",
)

#: The published checkpoints: the multimodal model's config.json and weights, read for its language model.
MULTIMODAL = language_model_of(FAMILY, name="Qwen3.5 (multimodal)", model_type="qwen3_5", architecture="Qwen3_5ForConditionalGeneration")
