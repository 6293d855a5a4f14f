"""BioGPT (``model_type: biogpt``, microsoft/biogpt): OPT's learned positions (offset 2) under BART's blocks --
pre-norm LayerNorm (eps 1e-5 whatever layer_norm_eps says), biased q/k/v/out and fc1/fc2, embeddings scaled by
sqrt(hidden_size) when scale_embedding."""

from __future__ import annotations

import math
from typing import Any

from specformer_hf.config import ACTIVATIONS_TO_HF, ConfigReader, activation_from_hf
from specformer_hf.family import Family
from specformer_hf.parts.embedding import model_sizes, model_sizes_config, no_output_bias
from specformer_hf.parts.fairseq import fairseq_layer_rules
from specformer_hf.rules import Copy
from specformer_hf.specview import NotExpressible, SpecView

NAME = "BioGPT"

#: transformers' BioGptConfig defaults (microsoft/biogpt's sizes, its docstring says).
DEFAULTS = {
    "vocab_size": 42384, "hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
    "intermediate_size": 4096, "hidden_act": "gelu", "max_position_embeddings": 1024, "layer_norm_eps": 1e-12,
    "scale_embedding": True, "tie_word_embeddings": True,
}

#: BioGptLearnedPositionalEmbedding (OPT's) reads row position + 2.
OFFSET = 2
#: BioGPT's LayerNorms are nn.LayerNorm's default: the config's layer_norm_eps never reaches them.
EPS = 1e-5


def to_spec(cfg: ConfigReader) -> dict[str, Any]:
    model = model_sizes(cfg)
    if cfg.get("scale_embedding"):
        model["embedding_multiplier"] = "sqrt_d_model"
    return {
        **model,
        "positional": {"kind": "learned", "offset": OFFSET},
        "block": {
            "layout": "prenorm",
            "norm": {"kind": "layernorm", "eps": EPS},
            "mixer": {"kind": "attention", "n_heads": cfg.get_size("num_attention_heads"), "qkv_bias": True,
                      "out_bias": True},
            "ffn": {"kind": "mlp", "hidden": cfg.get_size("intermediate_size"),
                    "activation": activation_from_hf(cfg, "hidden_act"), "bias": True},
        },
    }


def scale_embedding_config(view: SpecView, family: str) -> bool:
    """``scale_embedding``: embeddings times sqrt(d_model) (True) or as they are (False); nothing else."""
    m = view.model
    if m.embedding_multiplier == "sqrt_d_model" or float(m.embedding_multiplier) == math.sqrt(m.d_model):
        return True
    if float(m.embedding_multiplier) == 1.0:
        return False
    raise NotExpressible("model.embedding_multiplier", f"{m.embedding_multiplier!r}: Hugging Face {family} scales "
                         "embeddings by sqrt(d_model) (scale_embedding) or not at all")


def multi_head_biased(view: SpecView, family: str) -> int:
    """The head count of a model whose attention and MLP are as BART's: one key/value head per query head, each
    d_model / n_heads wide, biases everywhere, pre-norm LayerNorm with biases, no LM head bias."""
    m = view.model
    no_output_bias(view, family)
    view.block_kind("layout", ("prenorm",), family=family)
    view.block_kind("norm", ("layernorm",), family=family)
    view.block_kind("mixer", ("attention",), family=family)
    view.block_kind("ffn", ("mlp",), family=family)
    n_heads = view.multi_head(family=family)
    for path in ("mixer.qkv_bias", "mixer.out_bias", "ffn.bias"):
        if not view.uniform(*path.split("."), family=family):
            raise NotExpressible(f"model.block.{path}", f"Hugging Face {family} always has biases on q, k, v, the "
                                 "output projection and both MLP projections")
    if view.uniform("norm", "eps", family=family) != EPS or not view.uniform("norm", "bias", family=family) \
            or not view.uniform("norm", "affine", family=family):
        raise NotExpressible("model.block.norm", f"Hugging Face {family}'s LayerNorms have a weight, a bias and "
                             f"eps {EPS:g}")
    return n_heads


def to_config(view: SpecView) -> dict[str, Any]:
    m = view.model
    pos = view.expect(view.positional, "model.positional", ("learned",), family=NAME)
    if pos.get("offset") != OFFSET:
        raise NotExpressible("model.positional.offset", f"{pos.get('offset')}: Hugging Face {NAME}'s position table "
                             f"starts at row {OFFSET}")
    n_heads = multi_head_biased(view, NAME)
    return {
        **model_sizes_config(view),
        "num_attention_heads": n_heads,
        "intermediate_size": view.uniform("ffn", "hidden", family=NAME) or 4 * m.d_model,  # the mlp default
        "hidden_act": ACTIVATIONS_TO_HF[view.uniform("ffn", "activation", family=NAME)],
        "scale_embedding": scale_embedding_config(view, NAME),
    }


LAYER = "biogpt.layers.{i}"

WEIGHTS = [
    Copy("biogpt.embed_tokens.weight", "embedding.weight"),
    Copy("biogpt.embed_positions.weight", "positional.table.weight"),
    *fairseq_layer_rules(LAYER),
    Copy("biogpt.layer_norm.weight", "final_norm.weight"),
    Copy("biogpt.layer_norm.bias", "final_norm.bias"),
    Copy("output_projection.weight", "lm_head.weight"),
]

FAMILY = Family(
    name=NAME,
    model_type="biogpt",
    architecture="BioGptForCausalLM",
    defaults=DEFAULTS,
    to_spec=to_spec,
    to_config=to_config,
    weights=WEIGHTS,
    head_tensor="output_projection.weight",
    # layer_norm_eps: BioGptModel builds every LayerNorm with nn.LayerNorm's default eps, never this field.
    non_math_fields=("hidden_dropout_prob", "attention_probs_dropout_prob", "activation_dropout", "layerdrop",
                     "layer_norm_eps"),
    maps="learned positions with offset 2 (max_position_embeddings + 2 rows), scale_embedding -> embeddings times "
         "sqrt(hidden_size), pre-norm LayerNorm, q/k/v/out_proj and fc1/fc2 biases, hidden_act MLP "
         "(intermediate_size), output_projection as the LM head",
    caveats="multi-head attention only; the LayerNorms' eps is always 1e-5 (transformers never reads layer_norm_eps)",
)
