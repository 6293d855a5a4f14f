"""Qwen2 (``model_type: qwen2``): Llama's blocks with q/k/v biases and optional sliding windows on later layers."""

from __future__ import annotations

from typing import Any

from specformer_hf.config import ConfigReader
from specformer_hf.family import Family
from specformer_hf.families import common
from specformer_hf.specview import SpecView

NAME = "Qwen2"

#: transformers' Qwen2Config defaults.
DEFAULTS = {
    "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "hidden_act": "silu", "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "use_sliding_window": False, "sliding_window": 4096,
    "max_window_layers": 28, "layer_types": None, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


def layer_windows(cfg: ConfigReader) -> list[int | None]:
    """Each layer's window as transformers 5 decides it (Qwen2Config.__post_init__ and the attention)."""
    window = cfg.get("sliding_window")  # read either way: it matters only with use_sliding_window
    window = window if cfg.get("use_sliding_window") else None
    n_layers, first_sliding = cfg.get_layers("num_hidden_layers"), cfg.get_int("max_window_layers")
    default = ["sliding_attention" if window is not None and i >= first_sliding else "full_attention" for i in range(n_layers)]
    types = common.layer_types_from_config(cfg, default)
    return [window if t == "sliding_attention" else None for t in types]


def windowed_attention(cfg: ConfigReader, attention: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The block attention (window of most layers) and the overrides for the other layers."""
    windows = layer_windows(cfg)
    base = max(set(windows), key=lambda w: (windows.count(w), w is None))
    return {**attention, "window": base}, common.window_layers(base, windows)


def window_config(view: SpecView, family: str) -> dict[str, Any]:
    window = common.single_window(view, family)
    windows = view.per_layer("attention", "window")
    types = ["sliding_attention" if w is not None else "full_attention" for w in windows]
    sliding = [i for i, t in enumerate(types) if t == "sliding_attention"]
    # max_window_layers is what transformers 4 reads; it only describes "every layer from k on".
    first = sliding[0] if sliding and sliding == list(range(sliding[0], len(types))) else len(types)
    return {"use_sliding_window": window is not None, "sliding_window": window, "max_window_layers": first, "layer_types": types}


def to_spec(cfg: ConfigReader) -> dict[str, Any]:
    return prenorm_spec(cfg, {**common.attention_sizes(cfg), "qkv_bias": True})


def prenorm_spec(cfg: ConfigReader, attention: dict[str, Any]) -> dict[str, Any]:
    """The Qwen layout: pre-norm RMSNorm blocks, RoPE, SwiGLU, and ``attention`` windowed per layer."""
    attention, layers = windowed_attention(cfg, attention)
    spec: dict[str, Any] = {
        **common.model_sizes(cfg),
        "positional": common.rope(cfg),
        "block": {"layout": "prenorm", "norm": common.rmsnorm(cfg), "attention": attention, "ffn": common.gated_ffn(cfg)},
    }
    if layers:
        spec["layers"] = layers
    return spec


def to_config(view: SpecView) -> dict[str, Any]:
    common.no_output_bias(view, NAME)
    view.block_kind("layout", ("prenorm",), family=NAME)
    return {
        **common.model_sizes_config(view),
        **common.attention_sizes_config(view, NAME),
        **window_config(view, NAME),
        **common.gated_ffn_config(view, NAME),
        **common.rmsnorm_config(view, NAME),
        **common.rope_config(view, NAME),
    }


FAMILY = Family(
    name=NAME,
    model_type="qwen2",
    architecture="Qwen2ForCausalLM",
    defaults=DEFAULTS,
    to_spec=to_spec,
    to_config=to_config,
    weights=common.prenorm_rules() + common.llama_rules(),
    maps="as Llama with q/k/v biases (no o_proj bias); use_sliding_window, sliding_window, max_window_layers and layer_types -> per-layer windows",
    caveats="no attention_bias switch: q/k/v always have biases",
)
