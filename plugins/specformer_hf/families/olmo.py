"""OLMo (``model_type: olmo``, OLMo-1B, OLMo-7B): Llama with non-parametric LayerNorms (no weight, no bias, eps 1e-5)
and clip_qkv."""

from __future__ import annotations

from specformer_hf.parts.attention import Attention
from specformer_hf.parts.base import Switch, Value
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.feedforward import GatedFFN
from specformer_hf.parts.norms import LayerNorm, Layout
from specformer_hf.parts.positions import Rope

#: transformers' OlmoConfig defaults (OLMo-7B's sizes).
DEFAULTS = {
    "vocab_size": 50304, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "hidden_act": "silu", "max_position_embeddings": 2048,
    "tie_word_embeddings": False, "attention_bias": False, "clip_qkv": None,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}

# OlmoConfig has no head_dim field, but the attention reads one if config.json has it (Attention does).
FAMILY = decoder_family(
    name="OLMo",
    model_type="olmo",
    architecture="OlmoForCausalLM",
    defaults=DEFAULTS,
    parts=[
        Sizes(),
        Rope(),
        Layout("prenorm"),
        LayerNorm(affine=False, eps=1e-5),
        Attention(),
        GatedFFN(),
        Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
        Value("clip_qkv", "mixer.clip_qkv"),
    ],
    maps="as Llama (prenorm, rope, GQA, SwiGLU) with non-parametric LayerNorms (layernorm affine false, eps 1e-5) "
         "and clip_qkv (q, k and v clamped after their projection) as the attention's clip_qkv; attention_bias",
    caveats="the LayerNorms' eps is always 1e-5 (OlmoLayerNorm has no setting); attention_bias applies to q, k, v "
            "and o alike; the MLP never has biases",
)
