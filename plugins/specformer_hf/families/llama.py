"""Llama (``model_type: llama``): pre-norm RMSNorm, rotary positions, grouped-query attention, SwiGLU."""

from __future__ import annotations

from specformer_hf.parts.base import Switch
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family

#: transformers' LlamaConfig defaults (a saved config.json may leave any of these out).
DEFAULTS = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "head_dim": None, "hidden_act": "silu",
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "attention_bias": False, "mlp_bias": False, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}

FAMILY = decoder_family(
    name="Llama",
    model_type="llama",
    architecture="LlamaForCausalLM",
    defaults=DEFAULTS,
    parts=[
        *LLAMA_PARTS,
        Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
        Switch("mlp_bias", ("ffn.bias",)),
    ],
    ignore_tensors=(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq",),
    maps="prenorm RMSNorm, rope (theta), GQA, head_dim, attention_bias, mlp_bias, SwiGLU, tied or untied head",
    caveats="attention_bias applies to q, k, v and o alike (as in transformers)",
)
