"""SmolLM3 (``model_type: smollm3``): Llama's blocks with every fourth layer (or those no_rope_layers names) without
positions (NoPE)."""

from __future__ import annotations

from specformer_hf.families.common import (LLAMA_PARTS, NoRopeLayers, NoWindows, Rope, Switch, decoder_family,
                                           replace_part)

#: transformers' SmolLM3Config defaults.
DEFAULTS = {
    "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
    "num_attention_heads": 16, "num_key_value_heads": 4, "hidden_act": "silu", "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6, "use_sliding_window": False, "sliding_window": None, "no_rope_layers": None,
    "no_rope_layer_interval": 4, "layer_types": None, "attention_bias": False, "mlp_bias": False,
    "tie_word_embeddings": True, "rope_parameters": {"rope_type": "default", "rope_theta": 2000000.0},
}

FAMILY = decoder_family(
    name="SmolLM3",
    model_type="smollm3",
    architecture="SmolLM3ForCausalLM",
    defaults=DEFAULTS,
    parts=[
        *replace_part(LLAMA_PARTS, Rope(other_layers=("none",))),
        NoRopeLayers(),
        Switch("attention_bias", ("attention.qkv_bias", "attention.out_bias")),
        Switch("mlp_bias", ("ffn.bias",)),
        NoWindows(),
    ],
    maps="as Llama (attention_bias, mlp_bias) with per-layer positions: no_rope_layers / no_rope_layer_interval -> "
         "layers: [{select: ..., positional: none}] (NoPE layers)",
    caveats="use_sliding_window must be false (SmolLM3's windows on NoPE layers are not mapped)",
)
