"""EXAONE 4 (``model_type: exaone4``, EXAONE-4.0-1.2B / 32B): norms after each sublayer inside the residual, per-head
q/k RMSNorm, and three sliding-window layers with rope to one global layer without positions."""

from __future__ import annotations

from specformer_hf.parts.attention import QKNorm
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family, replace_part
from specformer_hf.parts.norms import Layout
from specformer_hf.parts.positions import Rope
from specformer_hf.parts.windows import SlidingRopeGlobalNope

#: transformers' Exaone4Config defaults.
DEFAULTS = {
    "vocab_size": 102400, "hidden_size": 4096, "intermediate_size": 16384, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "hidden_act": "silu", "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "sliding_window": 4096, "sliding_window_pattern": 4,
    "layer_types": None, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}

# Exaone4Config has no head_dim field, but the attention reads one if config.json has it (Attention does).
FAMILY = decoder_family(
    name="EXAONE 4",
    model_type="exaone4",
    architecture="Exaone4ForCausalLM",
    defaults=DEFAULTS,
    parts=[
        *replace_part(replace_part(LLAMA_PARTS, Layout("postnorm_inside")),
                      SlidingRopeGlobalNope(rope_without_window=True), instead_of=Rope),
        QKNorm("head"),
    ],
    maps="layout postnorm_inside (post_attention/post_feedforward norms), qk_norm RMSNorm per head, GQA, SwiGLU; "
         "layer_types (or an integer sliding_window_pattern) and sliding_window -> per-layer windows, rope on the "
         "sliding layers and positional none on the global ones; sliding_window null -> every layer global with rope",
    caveats="no biases; a string sliding_window_pattern (\"LLLG\") needs layer_types beside it, as transformers does",
)
