"""Qwen3 (``model_type: qwen3``): Qwen2's blocks with per-head RMSNorm on queries and keys, optional biases."""

from __future__ import annotations

from typing import Any

from specformer_hf.config import ConfigReader
from specformer_hf.family import Family
from specformer_hf.families import common, qwen2
from specformer_hf.rules import Copy
from specformer_hf.specview import NotExpressible, SpecView

NAME = "Qwen3"

#: transformers' Qwen3Config defaults.
DEFAULTS = {
    "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128, "hidden_act": "silu",
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False,
    "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28, "layer_types": None,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


def to_spec(cfg: ConfigReader) -> dict[str, Any]:
    bias = bool(cfg.get("attention_bias"))
    attention = {**common.attention_sizes(cfg), "qkv_bias": bias, "out_bias": bias,
                 "qk_norm": common.rmsnorm(cfg), "qk_norm_scope": "head"}
    return qwen2.prenorm_spec(cfg, attention)


def to_config(view: SpecView) -> dict[str, Any]:
    common.no_output_bias(view, NAME)
    view.block_kind("layout", ("prenorm",), family=NAME)
    if view.uniform("attention", "qk_norm", family=NAME) is None:
        raise NotExpressible("model.block.attention.qk_norm", "Hugging Face Qwen3 always normalises queries and keys (qk_norm: rmsnorm)")
    return {
        **common.model_sizes_config(view),
        **common.attention_sizes_config(view, NAME),
        "attention_bias": view.uniform("attention", "qkv_bias", family=NAME),
        **qwen2.window_config(view, NAME),
        **common.gated_ffn_config(view, NAME),
        **common.rmsnorm_config(view, NAME),
        **common.rope_config(view, NAME),
    }


FAMILY = Family(
    name=NAME,
    model_type="qwen3",
    architecture="Qwen3ForCausalLM",
    defaults=DEFAULTS,
    to_spec=to_spec,
    to_config=to_config,
    weights=common.prenorm_rules() + common.llama_rules() + [
        Copy("model.layers.{i}.self_attn.q_norm.weight", "blocks.{i}.attention.q_norm.weight"),
        Copy("model.layers.{i}.self_attn.k_norm.weight", "blocks.{i}.attention.k_norm.weight"),
    ],
    maps="as Qwen2 plus qk_norm (RMSNorm per head, before RoPE, eps rms_norm_eps); attention_bias on q, k, v, o",
    caveats="the q/k norms share rms_norm_eps with the block norms",
)
