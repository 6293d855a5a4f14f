"""Cohere2 (``model_type: cohere2``, Command R7B / Command A): parallel blocks under one bias-free LayerNorm, three
sliding-window layers with interleaved rope to one global layer without positions, and scaled logits."""

from __future__ import annotations

from specformer_hf.parts.attention import Attention
from specformer_hf.parts.base import Switch, Value
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.feedforward import GatedFFN
from specformer_hf.parts.norms import LayerNorm, Layout
from specformer_hf.parts.windows import SlidingRopeGlobalNope

#: transformers' Cohere2Config defaults.
DEFAULTS = {
    "vocab_size": 256000, "hidden_size": 8192, "intermediate_size": 22528, "logit_scale": 0.0625,
    "num_hidden_layers": 40, "num_attention_heads": 64, "num_key_value_heads": None, "hidden_act": "silu",
    "max_position_embeddings": 8192, "layer_norm_eps": 1e-5, "tie_word_embeddings": True, "attention_bias": False,
    "sliding_window": 4096, "layer_types": None, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


FAMILY = decoder_family(
    name="Cohere2",
    model_type="cohere2",
    architecture="Cohere2ForCausalLM",
    defaults=DEFAULTS,
    parts=[
        Sizes(),
        SlidingRopeGlobalNope(interleaved=True),
        Layout("parallel"),
        LayerNorm(bias=False),
        Attention(head_dim=False),
        GatedFFN(),
        Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
        Value("logit_scale", "logit_scale"),
    ],
    maps="layout parallel with one shared bias-free LayerNorm, logit_scale, GQA, attention_bias, SwiGLU, layer_types / "
         "sliding_window_pattern -> per-layer windows, interleaved rope on sliding layers and positional none on "
         "global ones",
    caveats="head_dim is always hidden / heads",
)
