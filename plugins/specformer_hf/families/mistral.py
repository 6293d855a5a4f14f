"""Mistral (``model_type: mistral``): Llama's blocks with a sliding attention window on every layer."""

from __future__ import annotations

from specformer_hf.parts.base import Value
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family

#: transformers' MistralConfig defaults.
DEFAULTS = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": None, "hidden_act": "silu",
    "max_position_embeddings": 4096 * 32, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "sliding_window": 4096, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}

FAMILY = decoder_family(
    name="Mistral",
    model_type="mistral",
    architecture="MistralForCausalLM",
    defaults=DEFAULTS,
    parts=[*LLAMA_PARTS, Value("sliding_window", "mixer.window")],
    maps="as Llama, plus sliding_window on every layer (null: full attention); no biases",
    caveats="a key is visible to a query when query - key < sliding_window, as in transformers 5",
)
