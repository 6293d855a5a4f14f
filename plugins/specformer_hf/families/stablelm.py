"""StableLM (``model_type: stablelm``, StableLM 2): LayerNorm, partial rotary, optional q/k/v biases and parallel blocks."""

from __future__ import annotations

from specformer_hf.families.common import (Attention, Fixed, GatedFFN, LayerNorm, Layout, Refuse, Rope, Sizes, Switch,
                                           decoder_family)

#: transformers' StableLmConfig defaults.
DEFAULTS = {
    "vocab_size": 50304, "intermediate_size": 6912, "hidden_size": 2560, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "hidden_act": "silu", "max_position_embeddings": 4096,
    "layer_norm_eps": 1e-5, "tie_word_embeddings": False, "use_qkv_bias": False, "qk_layernorm": False,
    "use_parallel_residual": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
}

FAMILY = decoder_family(
    name="StableLM",
    model_type="stablelm",
    architecture="StableLmForCausalLM",
    defaults=DEFAULTS,
    parts=[
        Sizes(),
        Rope(partial=True, write_fraction=True),
        Layout("prenorm", norm_bias=True, parallel_key="use_parallel_residual"),
        LayerNorm(),
        Attention(head_dim=False),
        GatedFFN(),
        Switch("use_qkv_bias", ("attention.qkv_bias",)),
        Fixed("attention.out_bias", False, why="has no o_proj bias"),
        Refuse("qk_layernorm", (False,), why="StableLM's q/k LayerNorms have separate weights for every head, which "
                                             "specformer's qk_norm (one weight shared by the heads) cannot hold"),
    ],
    maps="LayerNorm with biases, rope with partial_rotary_factor (default 0.25), GQA, use_qkv_bias, SwiGLU, "
         "use_parallel_residual -> layout parallel with one shared norm",
    caveats="qk_layernorm (per-head LayerNorm weights, StableLM 2 12B) is refused; head_dim is always hidden / heads",
)
