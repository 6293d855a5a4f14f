"""Gemma (``model_type: gemma``): Llama's blocks with (1 + w) RMSNorms, sqrt(d) embedding scale, GeGLU, tied head."""

from __future__ import annotations

from typing import Any

from specformer_hf.config import ConfigReader
from specformer_hf.family import Family
from specformer_hf.families import common
from specformer_hf.specview import NotExpressible, SpecView

NAME = "Gemma"

#: transformers' GemmaConfig defaults.
DEFAULTS = {
    "vocab_size": 256000, "hidden_size": 3072, "intermediate_size": 24576, "num_hidden_layers": 28,
    "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "attention_bias": False,
    "use_bidirectional_attention": None, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


def gemma_activation(cfg: ConfigReader, keys: tuple[str, ...] = ("hidden_act",)) -> dict[str, Any]:
    """Gemma's feed-forward; its configs say "gelu" where they mean the tanh approximation, as transformers knows."""
    key = next((k for k in ("hidden_activation", *keys) if cfg.has(k) and cfg.data[k] is not None), keys[0])
    cfg.mark_read("hidden_activation", *keys)
    if cfg.get(key) == "gelu":
        cfg.data[key] = "gelu_pytorch_tanh"
    return common.gated_ffn(cfg, act_key=key)


def check_embedding_scale(view: SpecView, family: str) -> None:
    m = view.model
    if m.embedding_multiplier != "sqrt_d_model" and float(m.embedding_multiplier) != m.d_model ** 0.5:
        raise NotExpressible("model.embedding_multiplier", f"{m.embedding_multiplier!r}: Hugging Face {family} always scales embeddings by sqrt(d_model)")


def to_spec(cfg: ConfigReader) -> dict[str, Any]:
    cfg.require("use_bidirectional_attention", (None, False), why="Gemma with bidirectional attention is not a causal LM")
    attention_bias = bool(cfg.get("attention_bias"))
    return {
        **common.model_sizes(cfg),
        "embedding_multiplier": "sqrt_d_model",
        "positional": common.rope(cfg),
        "block": {
            "layout": "prenorm",
            "norm": common.rmsnorm(cfg, offset=1.0),
            "attention": {**common.attention_sizes(cfg), "qkv_bias": attention_bias, "out_bias": attention_bias},
            "ffn": gemma_activation(cfg),
        },
    }


def to_config(view: SpecView) -> dict[str, Any]:
    common.no_output_bias(view, NAME)
    check_embedding_scale(view, NAME)
    view.block_kind("layout", ("prenorm",), family=NAME)
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
    model_type="gemma",
    architecture="GemmaForCausalLM",
    defaults=DEFAULTS,
    to_spec=to_spec,
    to_config=to_config,
    weights=common.prenorm_rules() + common.llama_rules(),
    maps="as Llama with rmsnorm offset 1 (weights stored as w, applied as 1 + w), embedding_multiplier sqrt_d_model, GeGLU (tanh GELU)",
    caveats='hidden_act "gelu" is read as the tanh approximation, as transformers does for Gemma',
)
