"""Qwen2 (``model_type: qwen2``): Llama's blocks with q/k/v biases and optional sliding windows on later layers."""

from __future__ import annotations

from specformer_hf.parts.base import Fixed
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family
from specformer_hf.parts.windows import QwenWindows

#: transformers' Qwen2Config defaults.
DEFAULTS = {
    "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "hidden_act": "silu", "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "use_sliding_window": False, "sliding_window": 4096,
    "max_window_layers": 28, "layer_types": None, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}

FAMILY = decoder_family(
    name="Qwen2",
    model_type="qwen2",
    architecture="Qwen2ForCausalLM",
    defaults=DEFAULTS,
    parts=[
        *LLAMA_PARTS,
        Fixed("mixer.qkv_bias", True, why="always has q/k/v biases"),
        Fixed("mixer.out_bias", False, why="has no o_proj bias"),
        QwenWindows(),
    ],
    maps="as Llama with q/k/v biases (no o_proj bias); use_sliding_window, sliding_window, max_window_layers and layer_types -> per-layer windows",
    caveats="no attention_bias switch: q/k/v always have biases",
)
