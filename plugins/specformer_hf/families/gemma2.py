"""Gemma 2 (``model_type: gemma2``): sandwich norms, soft-capped attention and logits, alternating sliding windows."""

from __future__ import annotations

import math
from typing import Any

from specformer_hf.config import ConfigReader
from specformer_hf.family import Family
from specformer_hf.families import common, gemma
from specformer_hf.rules import Copy
from specformer_hf.specview import NotExpressible, SpecView

NAME = "Gemma 2"

#: transformers' Gemma2Config defaults.
DEFAULTS = {
    "vocab_size": 256000, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "attention_bias": False,
    "query_pre_attn_scalar": 256, "sliding_window": 4096, "layer_types": None, "final_logit_softcapping": 30.0,
    "attn_logit_softcapping": 50.0, "use_bidirectional_attention": None,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


def to_spec(cfg: ConfigReader) -> dict[str, Any]:
    cfg.require("use_bidirectional_attention", (None, False), why="Gemma 2 with bidirectional attention is not a causal LM")
    bias = bool(cfg.get("attention_bias"))
    attention: dict[str, Any] = {**common.attention_sizes(cfg), "qkv_bias": bias, "out_bias": bias,
                                 "logit_softcap": cfg.get("attn_logit_softcapping")}
    scalar = cfg.get_float("query_pre_attn_scalar")
    if scalar != attention["head_dim"]:
        attention["scale"] = scalar ** -0.5
    n_layers = cfg.get_layers("num_hidden_layers")
    # Even layers slide, odd layers see everything (Gemma2Config's default layer_types).
    types = common.layer_types_from_config(cfg, ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n_layers)])
    window = cfg.get("sliding_window")
    windows = [window if t == "sliding_attention" else None for t in types]
    base = max(set(windows), key=lambda w: (windows.count(w), w is None))
    spec: dict[str, Any] = {
        **common.model_sizes(cfg),
        "embedding_multiplier": "sqrt_d_model",
        "logit_softcap": cfg.get("final_logit_softcapping"),
        "positional": common.rope(cfg),
        "block": {
            "layout": "sandwich",
            "norm": common.rmsnorm(cfg, offset=1.0),
            "attention": {**attention, "window": base},
            "ffn": gemma.gemma_activation(cfg, keys=("hidden_activation",)),
        },
    }
    layers = common.window_layers(base, windows)
    if layers:
        spec["layers"] = layers
    return spec


def to_config(view: SpecView) -> dict[str, Any]:
    m = view.model
    common.no_output_bias(view, NAME)
    gemma.check_embedding_scale(view, NAME)
    view.block_kind("layout", ("sandwich",), family=NAME)
    _, _, head_dim = view.attention_sizes()
    scale = view.uniform("attention", "scale", family=NAME)
    scalar: float = head_dim
    if scale is not None:
        scalar = scale ** -2
        if math.isclose(scalar, round(scalar), rel_tol=1e-9):
            scalar = int(round(scalar))
    window = common.single_window(view, NAME)
    windows = view.per_layer("attention", "window")
    if window is None:
        raise NotExpressible("model.layers[*].attention.window", "Hugging Face Gemma 2 needs sliding-window layers (sliding_window)")
    return {
        **common.model_sizes_config(view),
        **common.attention_sizes_config(view, NAME),
        "attention_bias": view.uniform("attention", "qkv_bias", family=NAME),
        "attn_logit_softcapping": view.uniform("attention", "logit_softcap", family=NAME),
        "final_logit_softcapping": m.logit_softcap,
        "query_pre_attn_scalar": scalar,
        "sliding_window": window,
        "layer_types": ["sliding_attention" if w is not None else "full_attention" for w in windows],
        **common.gated_ffn_config(view, NAME, act_key="hidden_activation"),
        **common.rmsnorm_config(view, NAME),
        **common.rope_config(view, NAME),
    }


FAMILY = Family(
    name=NAME,
    model_type="gemma2",
    architecture="Gemma2ForCausalLM",
    defaults=DEFAULTS,
    to_spec=to_spec,
    to_config=to_config,
    weights=common.llama_rules() + [
        Copy("model.layers.{i}.input_layernorm.weight", "blocks.{i}.attention_norm.weight"),
        Copy("model.layers.{i}.post_attention_layernorm.weight", "blocks.{i}.attention_post_norm.weight"),
        Copy("model.layers.{i}.pre_feedforward_layernorm.weight", "blocks.{i}.ffn_norm.weight"),
        Copy("model.layers.{i}.post_feedforward_layernorm.weight", "blocks.{i}.ffn_post_norm.weight"),
    ],
    maps="as Gemma with layout sandwich, attn_logit_softcapping -> attention logit_softcap, final_logit_softcapping -> "
         "logit_softcap, query_pre_attn_scalar -> scale, layer_types + sliding_window -> per-layer windows",
    caveats="soft-capped attention runs the eager (explicit softmax) path, as in transformers",
)
