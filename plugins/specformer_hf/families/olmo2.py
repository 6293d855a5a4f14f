"""OLMo-2 (``model_type: olmo2``): norms after each sublayer inside the residual branch; RMSNorm over all of q and k."""

from __future__ import annotations

from specformer_hf.parts.attention import QKNorm
from specformer_hf.parts.base import Switch
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family, replace_part
from specformer_hf.parts.norms import Layout

#: transformers' Olmo2Config defaults.
DEFAULTS = {
    "vocab_size": 50304, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "hidden_act": "silu", "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "attention_bias": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}

# Olmo2Config has no head_dim field, but the attention reads one if config.json has it (Attention does).
FAMILY = decoder_family(
    name="OLMo-2",
    model_type="olmo2",
    architecture="Olmo2ForCausalLM",
    defaults=DEFAULTS,
    parts=[
        *replace_part(LLAMA_PARTS, Layout("postnorm_inside")),
        Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
        QKNorm("all"),
    ],
    maps="layout postnorm_inside (post_attention/post_feedforward norms), qk_norm RMSNorm over the whole q and k "
         "projections (qk_norm_scope all), rope, SwiGLU, attention_bias",
    caveats="q_norm/k_norm span all heads (n_heads * head_dim channels), unlike Qwen3's per-head norms",
)
