"""Qwen3 (``model_type: qwen3``): Qwen2's blocks with per-head RMSNorm on queries and keys, optional biases."""

from __future__ import annotations

from specformer_hf.parts.attention import QKNorm
from specformer_hf.parts.base import Switch
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family
from specformer_hf.parts.windows import QwenWindows

#: transformers' Qwen3Config defaults.
DEFAULTS = {
    "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128, "hidden_act": "silu",
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False,
    "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28, "layer_types": None,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}

FAMILY = decoder_family(
    name="Qwen3",
    model_type="qwen3",
    architecture="Qwen3ForCausalLM",
    defaults=DEFAULTS,
    parts=[*LLAMA_PARTS, Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")), QKNorm("head"), QwenWindows()],
    maps="as Qwen2 plus qk_norm (RMSNorm per head, before RoPE, eps rms_norm_eps); attention_bias on q, k, v, o",
    caveats="the q/k norms share rms_norm_eps with the block norms",
)
