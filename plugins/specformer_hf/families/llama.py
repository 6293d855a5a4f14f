"""Llama (``model_type: llama``): pre-norm RMSNorm, rotary positions, grouped-query attention, SwiGLU."""

from __future__ import annotations

from typing import Any

from specformer_hf.config import ConfigReader
from specformer_hf.family import Family
from specformer_hf.families import common
from specformer_hf.specview import SpecView

NAME = "Llama"

#: transformers' LlamaConfig defaults (a saved config.json may leave any of these out).
DEFAULTS = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "head_dim": None, "hidden_act": "silu",
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "attention_bias": False, "mlp_bias": False, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


def to_spec(cfg: ConfigReader) -> dict[str, Any]:
    attention_bias = bool(cfg.get("attention_bias"))
    return {
        **common.model_sizes(cfg),
        "positional": common.rope(cfg),
        "block": {
            "layout": "prenorm",
            "norm": common.rmsnorm(cfg),
            "attention": {**common.attention_sizes(cfg), "qkv_bias": attention_bias, "out_bias": attention_bias},
            "ffn": common.gated_ffn(cfg, bias=bool(cfg.get("mlp_bias"))),
        },
    }


def to_config(view: SpecView) -> dict[str, Any]:
    common.no_output_bias(view, NAME)
    view.block_kind("layout", ("prenorm",), family=NAME)
    return {
        **common.model_sizes_config(view),
        **common.attention_sizes_config(view, NAME),
        "attention_bias": view.uniform("attention", "qkv_bias", family=NAME),
        **common.gated_ffn_config(view, NAME),
        "mlp_bias": view.uniform("ffn", "bias", family=NAME),
        **common.rmsnorm_config(view, NAME),
        **common.rope_config(view, NAME),
    }


FAMILY = Family(
    name=NAME,
    model_type="llama",
    architecture="LlamaForCausalLM",
    defaults=DEFAULTS,
    to_spec=to_spec,
    to_config=to_config,
    weights=common.prenorm_rules() + common.llama_rules(),
    ignore_tensors=(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq",),
    maps="prenorm RMSNorm, rope (theta), GQA, head_dim, attention_bias, mlp_bias, SwiGLU, tied or untied head",
    caveats="attention_bias applies to q, k, v and o alike (as in transformers)",
)
