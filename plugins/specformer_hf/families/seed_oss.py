"""Seed-OSS (``model_type: seed_oss``, Seed-OSS-36B): Llama's pre-norm blocks with a bias switch for q/k/v
(attention_bias, on by default) apart from o_proj's (attention_out_bias), mlp_bias, and head_dim."""

from __future__ import annotations

from specformer_hf.parts.base import Switch
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family

#: transformers' SeedOssConfig defaults (Seed-OSS-36B's sizes; the config class sets no rope theta of its own).
DEFAULTS = {
    "vocab_size": 155136, "hidden_size": 4096, "intermediate_size": 27648, "num_hidden_layers": 64,
    "num_attention_heads": 80, "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu",
    "max_position_embeddings": 524288, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": True,
    "attention_out_bias": False, "mlp_bias": False, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}

FAMILY = decoder_family(
    name="Seed-OSS",
    model_type="seed_oss",
    architecture="SeedOssForCausalLM",
    defaults=DEFAULTS,
    parts=[
        *LLAMA_PARTS,
        Switch("attention_bias", ("mixer.qkv_bias",)),
        Switch("attention_out_bias", ("mixer.out_bias",)),
        Switch("mlp_bias", ("ffn.bias",)),
    ],
    # Dropout after o_proj and down_proj, in training only.
    non_math_fields=("residual_dropout",),
    maps="as Llama (prenorm RMSNorm, rope, GQA, head_dim, SwiGLU); attention_bias (default on) -> q/k/v biases, "
         "attention_out_bias -> o_proj's, mlp_bias",
    caveats="residual_dropout (training only) is not part of the spec",
)
