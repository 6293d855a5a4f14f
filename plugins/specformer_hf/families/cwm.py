"""Code World Model (``model_type: cwm``, facebook/cwm): Llama's blocks (llama3 rope by default, head_dim, mlp_bias,
no attention biases) with sliding-window layers and a full-attention layer every fourth, per layer_types."""

from __future__ import annotations

from specformer_hf.parts.base import Switch
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family
from specformer_hf.parts.windows import LayerTypes

#: transformers' CwmConfig defaults (CWM's 32B shapes): the llama3 rope it sets when config.json has none.
DEFAULTS = {
    "vocab_size": 128256, "hidden_size": 6144, "intermediate_size": 21504, "num_hidden_layers": 64,
    "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu",
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "mlp_bias": False,
    "sliding_window": 8192, "layer_types": None,
    "rope_parameters": {"rope_type": "llama3", "rope_theta": 1_000_000.0, "factor": 16.0, "high_freq_factor": 4.0,
                        "low_freq_factor": 1.0, "original_max_position_embeddings": 8192},
}

FAMILY = decoder_family(
    name="CWM",
    model_type="cwm",
    architecture="CwmForCausalLM",
    defaults=DEFAULTS,
    parts=[
        *LLAMA_PARTS,
        # CwmConfig's default layer_types: layers 0, 4, 8, ... attend fully, the others through the window.
        LayerTypes(sliding=lambda i: i % 4 != 0),
        Switch("mlp_bias", ("ffn.bias",)),
    ],
    maps="as Llama (prenorm RMSNorm, rope with llama3 scaling by default, GQA, head_dim, SwiGLU, mlp_bias) with "
         "layer_types (default: every 4th layer full, from layer 0) and sliding_window -> per-layer windows",
    caveats="no attention biases (CwmConfig has no attention_bias); one sliding_window for every sliding layer",
)
