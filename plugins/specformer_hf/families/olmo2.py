"""OLMo-2 (``model_type: olmo2``): norms after each sublayer inside the residual branch; RMSNorm over all of q and k."""

from __future__ import annotations

from typing import Any

from specformer_hf.config import ConfigReader
from specformer_hf.family import Family
from specformer_hf.families import common
from specformer_hf.rules import Copy
from specformer_hf.specview import NotExpressible, SpecView

NAME = "OLMo-2"

#: transformers' Olmo2Config defaults.
DEFAULTS = {
    "vocab_size": 50304, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "hidden_act": "silu", "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "attention_bias": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


def to_spec(cfg: ConfigReader) -> dict[str, Any]:
    bias = bool(cfg.get("attention_bias"))
    # Olmo2Config has no head_dim field, but the attention reads one if config.json has it.
    sizes = common.attention_sizes(cfg)
    return {
        **common.model_sizes(cfg),
        "positional": common.rope(cfg),
        "block": {
            "layout": "postnorm_inside",
            "norm": common.rmsnorm(cfg),
            "attention": {**sizes, "qkv_bias": bias, "out_bias": bias, "qk_norm": common.rmsnorm(cfg), "qk_norm_scope": "all"},
            "ffn": common.gated_ffn(cfg),
        },
    }


def to_config(view: SpecView) -> dict[str, Any]:
    common.no_output_bias(view, NAME)
    view.block_kind("layout", ("postnorm_inside",), family=NAME)
    if view.uniform("attention", "qk_norm", family=NAME) is None:
        raise NotExpressible("model.block.attention.qk_norm", "Hugging Face OLMo-2 always normalises queries and keys")
    return {
        **common.model_sizes_config(view),
        **common.attention_sizes_config(view, NAME),
        "attention_bias": view.uniform("attention", "qkv_bias", family=NAME),
        **common.gated_ffn_config(view, NAME),
        **common.rmsnorm_config(view, NAME),
        **common.rope_config(view, NAME),
    }


FAMILY = Family(
    name=NAME,
    model_type="olmo2",
    architecture="Olmo2ForCausalLM",
    defaults=DEFAULTS,
    to_spec=to_spec,
    to_config=to_config,
    weights=common.llama_rules() + [
        Copy("model.layers.{i}.post_attention_layernorm.weight", "blocks.{i}.attention_norm.weight"),
        Copy("model.layers.{i}.post_feedforward_layernorm.weight", "blocks.{i}.ffn_norm.weight"),
        Copy("model.layers.{i}.self_attn.q_norm.weight", "blocks.{i}.attention.q_norm.weight"),
        Copy("model.layers.{i}.self_attn.k_norm.weight", "blocks.{i}.attention.k_norm.weight"),
    ],
    maps="layout postnorm_inside (post_attention/post_feedforward norms), qk_norm RMSNorm over the whole q and k "
         "projections (qk_norm_scope all), rope, SwiGLU, attention_bias",
    caveats="q_norm/k_norm span all heads (n_heads * head_dim channels), unlike Qwen3's per-head norms",
)
