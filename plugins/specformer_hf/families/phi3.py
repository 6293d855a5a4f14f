"""Phi-3 (``model_type: phi3``): Llama-like blocks with fused qkv and gate_up projections, LongRoPE, sliding window."""

from __future__ import annotations

from typing import Any

from specformer_hf.config import ConfigReader
from specformer_hf.family import Family
from specformer_hf.families import common
from specformer_hf.rules import Copy
from specformer_hf.specview import SpecView

NAME = "Phi-3"
ROPE_TYPES = ("default", "longrope")

#: transformers' Phi3Config defaults.
DEFAULTS = {
    "vocab_size": 32064, "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "hidden_act": "silu", "max_position_embeddings": 4096,
    "original_max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
    "sliding_window": None, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


def to_spec(cfg: ConfigReader) -> dict[str, Any]:
    # Phi3Config has no head_dim field, but the attention reads one if config.json has it.
    sizes = common.attention_sizes(cfg)
    cfg.mark_read("original_max_position_embeddings")
    for key in ("rope_scaling", "rope_parameters"):  # the legacy field wins when both are there
        params = cfg.data.get(key)
        if isinstance(params, dict):
            if params.get("rope_type", params.get("type")) in ("su", "yarn"):
                # transformers reads Phi-3's old "su" and "yarn" as longrope (Phi3Config.convert_rope_params_to_dict).
                cfg.data[key] = {**{k: v for k, v in params.items() if k != "type"}, "rope_type": "longrope"}
            break
    positional = common.rope(cfg, rope_types=ROPE_TYPES, original_override="original_max_position_embeddings", partial=True)
    common.check_rotary_dim(cfg, sizes["n_heads"], positional)
    return {
        **common.model_sizes(cfg),
        "positional": positional,
        "block": {
            "layout": "prenorm",
            "norm": common.rmsnorm(cfg),
            "attention": {**sizes, "window": cfg.get("sliding_window")},
            "ffn": common.gated_ffn(cfg),
        },
    }


def to_config(view: SpecView) -> dict[str, Any]:
    common.no_output_bias(view, NAME)
    view.block_kind("layout", ("prenorm",), family=NAME)
    config = {
        **common.model_sizes_config(view),
        **common.attention_sizes_config(view, NAME),
        "sliding_window": view.uniform("attention", "window", family=NAME),
        **common.gated_ffn_config(view, NAME),
        **common.rmsnorm_config(view, NAME),
        **common.rope_config(view, NAME, rope_types=ROPE_TYPES, partial=True),
    }
    scaling = view.positional.get("scaling") or {}
    # transformers takes LongRoPE's original context from this top-level field when it is there.
    config["original_max_position_embeddings"] = scaling.get("original_context_length") or view.model.context_length
    return config


FAMILY = Family(
    name=NAME,
    model_type="phi3",
    architecture="Phi3ForCausalLM",
    defaults=DEFAULTS,
    to_spec=to_spec,
    to_config=to_config,
    weights=common.prenorm_rules() + [
        Copy("model.embed_tokens.weight", "embedding.weight"),
        # qkv_proj rows are [q; k; v] and gate_up_proj rows [gate; up]: our fused layouts exactly.
        Copy("model.layers.{i}.self_attn.qkv_proj.weight", "blocks.{i}.attention.qkv.weight"),
        Copy("model.layers.{i}.self_attn.o_proj.weight", "blocks.{i}.attention.out.weight"),
        Copy("model.layers.{i}.mlp.gate_up_proj.weight", "blocks.{i}.ffn.gate_up.weight"),
        Copy("model.layers.{i}.mlp.down_proj.weight", "blocks.{i}.ffn.down.weight"),
        Copy("model.norm.weight", "final_norm.weight"),
        Copy("lm_head.weight", "lm_head.weight"),
    ],
    maps="fused qkv_proj and gate_up_proj copied as is, rope (default or longrope, partial_rotary_factor), "
         "sliding_window on every layer",
    caveats="original_max_position_embeddings (top level) is LongRoPE's original context, as in transformers",
)
