"""BLOOM (``model_type: bloom``, BigScience): ALiBi positions, a LayerNorm on the token embeddings
(word_embeddings_layernorm), pre-norm LayerNorm blocks with a per-head fused query_key_value, a GELU MLP four
times as wide, biases everywhere."""

from __future__ import annotations

from typing import Any

from specformer_hf.config import ConfigReader
from specformer_hf.families.falcon import FINAL_NORM_AND_HEAD, attention_and_mlp_rules
from specformer_hf.family import Family
from specformer_hf.parts.embedding import no_output_bias
from specformer_hf.rules import Copy, Rule
from specformer_hf.specview import NotExpressible, SpecView

NAME = "BLOOM"

#: transformers' BloomConfig defaults (tiny sizes: hidden 64, 2 layers, 8 heads; BLOOM-560M's are in
#: specs/bloom-560m.yaml).
DEFAULTS = {
    "vocab_size": 250880, "hidden_size": 64, "n_layer": 2, "n_head": 8, "layer_norm_epsilon": 1e-5,
    "apply_residual_connection_post_layernorm": False, "pretraining_tp": 1, "slow_but_exact": False,
    "tie_word_embeddings": True,
}
#: BLOOM has no context limit and its config no max_position_embeddings (ALiBi): the spec needs one. BLOOM was
#: trained on sequences of 2048 tokens.
DEFAULT_CONTEXT = 2048


def _context_length(cfg: ConfigReader) -> int:
    """max_position_embeddings where the config has one (specformer writes it), else :data:`DEFAULT_CONTEXT`."""
    return DEFAULT_CONTEXT if cfg.get("max_position_embeddings", None) is None \
        else cfg.get_size("max_position_embeddings")


def to_spec(cfg: ConfigReader) -> dict[str, Any]:
    cfg.require("apply_residual_connection_post_layernorm", (False,),
                why="a residual taken after the block's LayerNorm is a layout specformer lacks (every published "
                    "BLOOM says false)")
    # pretraining_tp with slow_but_exact splits the output projections' matmuls into slices summed in turn: the
    # same maths in another order of additions.
    cfg.mark_read("pretraining_tp", "slow_but_exact")
    d_model, n_heads = cfg.get_width_and_heads("hidden_size", "n_head", model="BLOOM")
    eps = cfg.get_float("layer_norm_epsilon")
    norm = {"kind": "layernorm", "eps": eps}
    return {
        "vocab_size": cfg.get_int("vocab_size"),
        "d_model": d_model,
        "n_layers": cfg.get_layers("n_layer"),
        "context_length": _context_length(cfg),
        "tie_embeddings": bool(cfg.get("tie_word_embeddings")),
        "positional": {"kind": "alibi"},
        "embedding_norm": norm,
        "final_norm": norm,
        "block": {
            "layout": "prenorm",
            "norm": norm,
            "mixer": {"kind": "attention", "n_heads": n_heads, "n_kv_heads": n_heads, "qkv_bias": True,
                      "out_bias": True},
            # bloom_gelu_forward is the tanh approximation
            "ffn": {"kind": "mlp", "hidden": 4 * d_model, "activation": "gelu_tanh", "bias": True},
        },
    }


def to_config(view: SpecView) -> dict[str, Any]:
    m = view.model
    no_output_bias(view, NAME)
    if view.positional["kind"] != "alibi" or any(p is not None and p["kind"] != "alibi"
                                                 for p in view.per_layer("positional")):
        raise NotExpressible("model.positional.kind", f"Hugging Face {NAME} has ALiBi positions in every layer")
    if m.embedding_norm is None:
        raise NotExpressible("model.embedding_norm", f"Hugging Face {NAME} has a LayerNorm on the token embeddings "
                             "(word_embeddings_layernorm); the spec has none")
    view.block_kind("layout", ("prenorm",), family=NAME)
    view.block_kind("norm", ("layernorm",), family=NAME)
    view.block_kind("mixer", ("attention",), family=NAME)
    view.block_kind("ffn", ("mlp",), family=NAME)
    n_heads = view.multi_head(family=NAME)
    if (view.uniform("ffn", "hidden", family=NAME) or 4 * m.d_model) != 4 * m.d_model:
        raise NotExpressible("model.block.ffn.hidden", f"Hugging Face {NAME}'s MLP is always 4 x d_model "
                             f"({4 * m.d_model}) wide")
    # The norms' eps, the biases and the activation: any other value reads back otherwise and export names it.
    return {
        "vocab_size": m.vocab_size,
        "hidden_size": m.d_model,
        "n_layer": m.n_layers,
        "n_head": n_heads,
        "max_position_embeddings": m.context_length,
        "layer_norm_epsilon": view.uniform("norm", "eps", family=NAME),
        "apply_residual_connection_post_layernorm": False,
        "pretraining_tp": 1,
        "slow_but_exact": False,
        "tie_word_embeddings": m.tie_embeddings,
    }


LAYER = "transformer.h.{i}"

WEIGHTS: list[Rule] = [
    Copy("transformer.word_embeddings.weight", "embedding.weight"),
    Copy("transformer.word_embeddings_layernorm.weight", "embedding_norm.weight"),
    Copy("transformer.word_embeddings_layernorm.bias", "embedding_norm.bias"),
    Copy(f"{LAYER}.input_layernorm.weight", "blocks.{i}.attention_norm.weight"),
    Copy(f"{LAYER}.input_layernorm.bias", "blocks.{i}.attention_norm.bias"),
    Copy(f"{LAYER}.post_attention_layernorm.weight", "blocks.{i}.ffn_norm.weight"),
    Copy(f"{LAYER}.post_attention_layernorm.bias", "blocks.{i}.ffn_norm.bias"),
    # query_key_value holds each head's [q; k; v] in turn: Falcon's grouping with one query head per group.
    *attention_and_mlp_rules(LAYER),
    *FINAL_NORM_AND_HEAD,
]

FAMILY = Family(
    name=NAME,
    model_type="bloom",
    architecture="BloomForCausalLM",
    defaults=DEFAULTS,
    to_spec=to_spec,
    to_config=to_config,
    weights=WEIGHTS,
    maps="alibi positions; word_embeddings_layernorm -> model.embedding_norm (layernorm); prenorm LayerNorms with "
         "biases, one layer_norm_epsilon for all; query_key_value regrouped from per-head [q, k, v] to [q; k; v]; "
         "biases on every projection; GELU (tanh) MLP 4 x hidden; pretraining_tp / slow_but_exact (the same maths "
         "summed in slices); max_position_embeddings (written by specformer) -> context_length",
    caveats=f"context_length is {DEFAULT_CONTEXT} when config.json has no max_position_embeddings (ALiBi has no "
            "limit); apply_residual_connection_post_layernorm: true is refused",
)
