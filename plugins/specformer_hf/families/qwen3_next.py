"""Qwen3-Next (``model_type: qwen3_next``, Qwen3-Next-80B-A3B): three Gated DeltaNet layers to one gated attention
layer, (1 + w) RMSNorms, a quarter of each head rotated, routed experts with a gated shared expert."""

from __future__ import annotations

from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.deltanet import (AttentionFields, DeltaNetFields, HybridMixers, gated_attention_rules,
                                          qwen3_next_delta_rules, qwen_default_types)
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.feedforward import MixtureOfExperts
from specformer_hf.parts.mtp import SEPARATE_LAYER, SeparateMTP
from specformer_hf.parts.norms import Layout, RMSNorm
from specformer_hf.parts.positions import TextRope

#: transformers' Qwen3NextConfig defaults (its __post_init__ puts partial_rotary_factor 0.25 into the rope parameters).
DEFAULTS = {
    "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 48,
    "num_attention_heads": 16, "num_key_value_heads": 2, "hidden_act": "silu", "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False, "head_dim": 256,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "decoder_sparse_step": 1, "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512, "num_experts_per_tok": 10, "num_experts": 512, "norm_topk_prob": True,
    "router_aux_loss_coef": 0.001, "mlp_only_layers": None, "layer_types": None,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
}

FAMILY = decoder_family(
    name="Qwen3-Next",
    model_type="qwen3_next",
    architecture="Qwen3NextForCausalLM",
    defaults=DEFAULTS,
    parts=[
        Sizes(), TextRope(partial=True, write_fraction=True), Layout("prenorm"), RMSNorm(offset=1.0),
        MixtureOfExperts(hidden="moe_intermediate_size", normalize="norm_topk_prob", shared=True, dense=True),
        HybridMixers(DeltaNetFields(), AttentionFields(gated=True), qwen_default_types),
        SeparateMTP(AttentionFields(gated=True)),
    ],
    extra_rules=[*qwen3_next_delta_rules(), *gated_attention_rules()],
    mtp_layer=SEPARATE_LAYER,
    # transformers' Qwen3NextPreTrainedModel ignores mtp.* (and its config has no mtp_num_hidden_layers); import reads
    # them as model.mtp, and skips them only where config.json counts no MTP layer.
    ignore_tensors=(r"mtp\..*",),
    non_math_fields=("use_sliding_window",),  # in the published config.json; transformers' Qwen3-Next has no windows
    maps="layer_types (or every full_attention_interval-th layer) -> gated_deltanet in the block and attention in a "
         "layers: override; linear_num_value_heads / linear_num_key_heads / linear_key_head_dim / "
         "linear_value_head_dim / linear_conv_kernel_dim -> the Gated DeltaNet; attention with output_gate and "
         "(1 + w) q/k RMSNorm per head; partial_rotary_factor -> rope fraction; (1 + w) RMSNorm everywhere; ffn moe "
         "with one gated shared expert, decoder_sparse_step and mlp_only_layers -> dense layers; mtp_num_hidden_layers "
         "(0 or 1) -> mtp depths (mtp.fc, pre_fc_norm_embedding, pre_fc_norm_hidden, a full-attention decoder layer "
         "mtp.layers.0, mtp.norm)",
    caveats="in_proj_qkvz / in_proj_ba are regrouped per key head on import and export; a file without the "
            "multi-token prediction layer its config counts imports without model.mtp, with a note; hidden_act must be silu (it is also the "
            "convolution's activation)",
)
