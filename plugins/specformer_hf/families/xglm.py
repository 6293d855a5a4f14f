"""XGLM (``model_type: xglm``, facebook/xglm-564M ... 7.5B): fairseq's sinusoidal positions (offset 2, every sine
then every cosine, frequencies 10000^(-i/(d/2 - 1))) under BioGPT's blocks -- pre-norm LayerNorm (eps 1e-5), biased
q/k/v/out and fc1/fc2, embeddings scaled by sqrt(d_model) when scale_embedding."""

from __future__ import annotations

from typing import Any

from specformer_hf.config import ACTIVATIONS_TO_HF, ConfigReader, activation_from_hf
from specformer_hf.families.biogpt import EPS, multi_head_biased, scale_embedding_config
from specformer_hf.family import Family
from specformer_hf.parts.fairseq import fairseq_layer_rules
from specformer_hf.rules import Copy
from specformer_hf.specview import NotExpressible, SpecView

NAME = "XGLM"

#: transformers' XGLMConfig defaults (facebook/xglm-564M's sizes).
DEFAULTS = {
    "vocab_size": 256008, "max_position_embeddings": 2048, "d_model": 1024, "ffn_dim": 4096, "num_layers": 24,
    "attention_heads": 16, "activation_function": "gelu", "scale_embedding": True, "pad_token_id": 1,
    "add_cross_attention": False, "tie_word_embeddings": True,
}

#: XGLMSinusoidalPositionalEmbedding encodes position p as p + 2 (fairseq's positions start after the padding index).
OFFSET = 2
#: fairseq's sinusoidal table: every sine then every cosine, pair i turning at 10000^(-i/(d/2 - 1)).
POSITIONS = {"kind": "sinusoidal", "offset": OFFSET, "split_halves": True, "frequencies": "half_minus_one"}


def to_spec(cfg: ConfigReader) -> dict[str, Any]:
    cfg.require("add_cross_attention", (False,), why="XGLM with cross-attention is an encoder-decoder's decoder")
    # transformers zeroes the table's row pad_token_id; rows 0 and 1 come before position 0's, any other is a position.
    cfg.require("pad_token_id", (None, 0, 1),
                why=f"XGLM zeroes the sinusoidal row pad_token_id, which is position pad_token_id - {OFFSET} when it "
                    "is 2 or more, and specformer's encoding has no such hole")
    d_model = cfg.get_size("d_model")
    model: dict[str, Any] = {
        "vocab_size": cfg.get_int("vocab_size"),
        "d_model": d_model,
        "n_layers": cfg.get_layers("num_layers"),
        "context_length": cfg.get_int("max_position_embeddings"),
        "tie_embeddings": bool(cfg.get("tie_word_embeddings")),
    }
    if cfg.get("scale_embedding"):
        model["embedding_multiplier"] = "sqrt_d_model"
    return {
        **model,
        "positional": dict(POSITIONS),
        "block": {
            "layout": "prenorm",
            "norm": {"kind": "layernorm", "eps": EPS},
            "mixer": {"kind": "attention", "n_heads": cfg.get_size("attention_heads"), "qkv_bias": True,
                      "out_bias": True},
            "ffn": {"kind": "mlp", "hidden": cfg.get_size("ffn_dim"),
                    "activation": activation_from_hf(cfg, "activation_function"), "bias": True},
        },
    }


def to_config(view: SpecView) -> dict[str, Any]:
    m = view.model
    pos = view.expect(view.positional, "model.positional", ("sinusoidal",), family=NAME)
    for key, value in POSITIONS.items():
        if pos.get(key) != value:
            raise NotExpressible(f"model.positional.{key}", f"{pos.get(key)!r}: Hugging Face {NAME}'s sinusoidal "
                                 f"positions have offset {OFFSET}, split_halves and frequencies half_minus_one")
    if pos.get("base") != 10000.0:
        raise NotExpressible("model.positional.base", f"{pos.get('base')}: Hugging Face {NAME}'s base is 10000")
    n_heads = multi_head_biased(view, NAME)
    return {
        "vocab_size": m.vocab_size,
        "max_position_embeddings": m.context_length,
        "d_model": m.d_model,
        "ffn_dim": view.uniform("ffn", "hidden", family=NAME) or 4 * m.d_model,  # the mlp default
        "num_layers": m.n_layers,
        "attention_heads": n_heads,
        "activation_function": ACTIVATIONS_TO_HF[view.uniform("ffn", "activation", family=NAME)],
        "scale_embedding": scale_embedding_config(view, NAME),
        "tie_word_embeddings": m.tie_embeddings,
    }


LAYER = "model.layers.{i}"

WEIGHTS = [
    Copy("model.embed_tokens.weight", "embedding.weight"),
    *fairseq_layer_rules(LAYER),
    Copy("model.layer_norm.weight", "final_norm.weight"),
    Copy("model.layer_norm.bias", "final_norm.bias"),
    Copy("lm_head.weight", "lm_head.weight"),
]

FAMILY = Family(
    name=NAME,
    model_type="xglm",
    architecture="XGLMForCausalLM",
    defaults=DEFAULTS,
    to_spec=to_spec,
    to_config=to_config,
    weights=WEIGHTS,
    # Old checkpoints saved the sinusoidal table (a buffer transformers now recomputes).
    ignore_tensors=(r"(model\.)?embed_positions\.weights?",),
    non_math_fields=("dropout", "activation_dropout", "layerdrop", "init_std"),
    maps="sinusoidal positions as fairseq's (offset 2, every sine then every cosine, frequencies "
         "10000^(-i/(d_model/2 - 1))), scale_embedding -> embeddings times sqrt(d_model), pre-norm LayerNorm, "
         "q/k/v/out_proj and fc1/fc2 biases, activation_function MLP (ffn_dim)",
    caveats="multi-head attention only; the LayerNorms' eps is always 1e-5; pad_token_id 2 or more is refused (transformers "
            "zeroes that position's encoding); d_model must be even",
)
