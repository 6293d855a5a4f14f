"""CTRL (``model_type: ctrl``, Salesforce/ctrl): sinusoidal positions (every sine, then every cosine) added to
embeddings scaled by sqrt(n_embd), pre-norm LayerNorm blocks (eps 1e-6) with separate q/k/v projections, a ReLU
MLP (dff), biases everywhere, and a tied LM head with a bias of its own (lm_head.bias)."""

from __future__ import annotations

import math
from typing import Any

from specformer_hf.config import ConfigReader
from specformer_hf.family import Family
from specformer_hf.rules import Copy, Fused, Rule, qkv_sizes
from specformer_hf.specview import NotExpressible, SpecView

NAME = "CTRL"

#: transformers' CTRLConfig defaults (Salesforce/ctrl's sizes).
DEFAULTS = {
    "vocab_size": 246534, "n_positions": 256, "n_embd": 1280, "dff": 8192, "n_layer": 48, "n_head": 16,
    "layer_norm_epsilon": 1e-6, "tie_word_embeddings": True,
}
#: CTRL's block LayerNorms are built with eps 1e-6 whatever the config says (layer_norm_epsilon is the final one's).
BLOCK_EPS = 1e-6
#: CTRL's table: angle p / 10000^(2i/d) for pair i, the sines first and the cosines after them.
POSITIONS = {"kind": "sinusoidal", "split_halves": True}


def to_spec(cfg: ConfigReader) -> dict[str, Any]:
    d_model, n_heads = cfg.get_width_and_heads("n_embd", "n_head", model="CTRL")
    return {
        "vocab_size": cfg.get_int("vocab_size"),
        "d_model": d_model,
        "n_layers": cfg.get_layers("n_layer"),
        "context_length": cfg.get_int("n_positions"),
        "tie_embeddings": bool(cfg.get("tie_word_embeddings")),
        # CTRLLMHeadModel's lm_head always has a bias, beside its weight tied to the embedding or not.
        "lm_head_bias": True,
        "embedding_multiplier": "sqrt_d_model",
        "positional": dict(POSITIONS),
        "final_norm": {"kind": "layernorm", "eps": cfg.get_float("layer_norm_epsilon")},
        "block": {
            "layout": "prenorm",
            "norm": {"kind": "layernorm", "eps": BLOCK_EPS},
            "mixer": {"kind": "attention", "n_heads": n_heads, "n_kv_heads": n_heads, "qkv_bias": True,
                      "out_bias": True},
            "ffn": {"kind": "mlp", "hidden": cfg.get_size("dff"), "activation": "relu", "bias": True},
        },
    }


def to_config(view: SpecView) -> dict[str, Any]:
    m = view.model
    if not m.lm_head_bias:
        raise NotExpressible("model.lm_head_bias", f"Hugging Face {NAME}'s LM head always has a bias")
    if m.embedding_multiplier != "sqrt_d_model" and not math.isclose(float(m.embedding_multiplier), math.sqrt(m.d_model)):
        raise NotExpressible("model.embedding_multiplier", f"Hugging Face {NAME} scales the embeddings by "
                             "sqrt(d_model) (embedding_multiplier: sqrt_d_model)")
    view.expect(view.positional, "model.positional", ("sinusoidal",), family=NAME)
    view.block_kind("layout", ("prenorm",), family=NAME)
    view.block_kind("norm", ("layernorm",), family=NAME)
    view.block_kind("mixer", ("attention",), family=NAME)
    view.block_kind("ffn", ("mlp",), family=NAME)
    n_heads = view.multi_head(family=NAME)
    view.expect(view.final_norm, "model.final_norm", ("layernorm",), family=NAME)
    # The sinusoid's variant, the block eps (always 1e-6), the biases and the activation: any other value reads
    # back otherwise and export names it.
    return {
        "vocab_size": m.vocab_size,
        "n_positions": m.context_length,
        "n_embd": m.d_model,
        "dff": view.uniform("ffn", "hidden", family=NAME) or 4 * m.d_model,
        "n_layer": m.n_layers,
        "n_head": n_heads,
        "layer_norm_epsilon": view.final_norm["eps"],
        "tie_word_embeddings": m.tie_embeddings,
    }


LAYER = "transformer.h.{i}"
ATTN = f"{LAYER}.multi_head_attention"

WEIGHTS: list[Rule] = [
    Copy("transformer.w.weight", "embedding.weight"),
    Copy(f"{LAYER}.layernorm1.weight", "blocks.{i}.attention_norm.weight"),
    Copy(f"{LAYER}.layernorm1.bias", "blocks.{i}.attention_norm.bias"),
    Fused([f"{ATTN}.Wq.weight", f"{ATTN}.Wk.weight", f"{ATTN}.Wv.weight"], "blocks.{i}.mixer.qkv.weight",
          sizes=qkv_sizes),
    Fused([f"{ATTN}.Wq.bias", f"{ATTN}.Wk.bias", f"{ATTN}.Wv.bias"], "blocks.{i}.mixer.qkv.bias", sizes=qkv_sizes),
    Copy(f"{ATTN}.dense.weight", "blocks.{i}.mixer.out.weight"),
    Copy(f"{ATTN}.dense.bias", "blocks.{i}.mixer.out.bias"),
    Copy(f"{LAYER}.layernorm2.weight", "blocks.{i}.ffn_norm.weight"),
    Copy(f"{LAYER}.layernorm2.bias", "blocks.{i}.ffn_norm.bias"),
    # point_wise_feed_forward_network: Sequential(Linear, ReLU, Linear)
    Copy(f"{LAYER}.ffn.0.weight", "blocks.{i}.ffn.fc_in.weight"),
    Copy(f"{LAYER}.ffn.0.bias", "blocks.{i}.ffn.fc_in.bias"),
    Copy(f"{LAYER}.ffn.2.weight", "blocks.{i}.ffn.fc_out.weight"),
    Copy(f"{LAYER}.ffn.2.bias", "blocks.{i}.ffn.fc_out.bias"),
    Copy("transformer.layernorm.weight", "final_norm.weight"),
    Copy("transformer.layernorm.bias", "final_norm.bias"),
    Copy("lm_head.weight", "lm_head.weight"),
    # The head's bias: the Linear's own when untied, the tied head's separate parameter otherwise.
    Copy("lm_head.bias", "lm_head.bias"),
    Copy("lm_head.bias", "head_bias.bias"),
]

FAMILY = Family(
    name=NAME,
    model_type="ctrl",
    architecture="CTRLLMHeadModel",
    defaults=DEFAULTS,
    to_spec=to_spec,
    to_config=to_config,
    weights=WEIGHTS,
    non_math_fields=("resid_pdrop", "embd_pdrop"),
    maps="sinusoidal positions (split_halves: every sine then every cosine, pair i at 10000^(-2i/d); n_positions "
         "as the context) added to embeddings scaled by sqrt(n_embd); prenorm LayerNorms (eps 1e-6) and the final "
         "one (layer_norm_epsilon); Wq, Wk, Wv fused into qkv, dense, biases on all; a ReLU mlp of dff; lm_head.bias "
         "as lm_head_bias (a parameter of its own beside the tied weight)",
    caveats="the block LayerNorms' eps is always 1e-6 (transformers' CTRL has no setting); multi-head attention only",
)
