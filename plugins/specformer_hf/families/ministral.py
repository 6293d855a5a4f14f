"""Ministral (``model_type: ministral``, Ministral-8B-Instruct-2410): Mistral's blocks (no attention biases, head_dim)
with layer_types choosing per layer between the sliding window and full attention."""

from __future__ import annotations

from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family
from specformer_hf.parts.windows import LayerTypes

#: transformers' MinistralConfig defaults (MistralConfig's; layer_types default to every layer sliding when
#: sliding_window is set, every layer full otherwise).
DEFAULTS = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": None, "hidden_act": "silu",
    "max_position_embeddings": 4096 * 32, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "sliding_window": 4096,
    "layer_types": None, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}

FAMILY = decoder_family(
    name="Ministral",
    model_type="ministral",
    architecture="MinistralForCausalLM",
    defaults=DEFAULTS,
    # A null sliding_window leaves every layer full, whatever layer_types says (as in transformers' masks).
    parts=[*LLAMA_PARTS, LayerTypes(sliding=lambda i: True)],
    maps="as Mistral (prenorm RMSNorm, rope, GQA, head_dim, SwiGLU) with layer_types (default: every layer sliding) "
         "and sliding_window -> per-layer windows",
    caveats="no attention or MLP biases (transformers' Ministral has none); one sliding_window for every sliding layer",
)
