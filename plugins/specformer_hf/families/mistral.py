"""Mistral (``model_type: mistral``): Llama's blocks with a sliding attention window on every layer."""

from __future__ import annotations

from typing import Any

from specformer_hf.config import ConfigReader
from specformer_hf.family import Family
from specformer_hf.families import common
from specformer_hf.specview import SpecView

NAME = "Mistral"

#: transformers' MistralConfig defaults.
DEFAULTS = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": None, "hidden_act": "silu",
    "max_position_embeddings": 4096 * 32, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "sliding_window": 4096, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


def to_spec(cfg: ConfigReader) -> dict[str, Any]:
    return {
        **common.model_sizes(cfg),
        "positional": common.rope(cfg),
        "block": {
            "layout": "prenorm",
            "norm": common.rmsnorm(cfg),
            "attention": {**common.attention_sizes(cfg), "window": cfg.get("sliding_window")},
            "ffn": common.gated_ffn(cfg),
        },
    }


def to_config(view: SpecView) -> dict[str, Any]:
    common.no_output_bias(view, NAME)
    view.block_kind("layout", ("prenorm",), family=NAME)
    return {
        **common.model_sizes_config(view),
        **common.attention_sizes_config(view, NAME),
        "sliding_window": view.uniform("attention", "window", family=NAME),
        **common.gated_ffn_config(view, NAME),
        **common.rmsnorm_config(view, NAME),
        **common.rope_config(view, NAME),
    }


FAMILY = Family(
    name=NAME,
    model_type="mistral",
    architecture="MistralForCausalLM",
    defaults=DEFAULTS,
    to_spec=to_spec,
    to_config=to_config,
    weights=common.prenorm_rules() + common.llama_rules(),
    maps="as Llama, plus sliding_window on every layer (null: full attention); no biases",
    caveats="a key is visible to a query when query - key < sliding_window, as in transformers 5",
)
