"""OPT (``model_type: opt``): learned positions starting at row 2 of their table, pre-norm LayerNorm, ReLU MLP,
q/k/v/out and fc1/fc2 biases switched together (enable_bias)."""

from __future__ import annotations

from typing import Any

from specformer_hf.config import ACTIVATIONS_TO_HF, ConfigReader, activation_from_hf
from specformer_hf.family import Family
from specformer_hf.parts.fairseq import fairseq_layer_rules
from specformer_hf.rules import Copy
from specformer_hf.specview import NotExpressible, SpecView

NAME = "OPT"

#: transformers' OPTConfig defaults (facebook/opt-125m's sizes).
DEFAULTS = {
    "vocab_size": 50272, "hidden_size": 768, "num_hidden_layers": 12, "ffn_dim": 3072, "max_position_embeddings": 2048,
    "do_layer_norm_before": True, "_remove_final_layer_norm": False, "word_embed_proj_dim": None,
    "num_attention_heads": 12, "activation_function": "relu", "enable_bias": True,
    "layer_norm_elementwise_affine": True, "tie_word_embeddings": True,
}

#: OPTLearnedPositionalEmbedding reads row position + 2: the first two rows of its table are never used.
OFFSET = 2
#: OPT's LayerNorms are nn.LayerNorm's default (the config has no eps).
EPS = 1e-5


def to_spec(cfg: ConfigReader) -> dict[str, Any]:
    cfg.require("do_layer_norm_before", (True,),
                why="post-norm OPT (OPT-350m) ends without a final LayerNorm, and specformer's model always has one")
    cfg.require("_remove_final_layer_norm", (False,),
                why="it removes the final LayerNorm, and specformer's model always has one")
    d_model = cfg.get_size("hidden_size")
    cfg.require("word_embed_proj_dim", (None, d_model),
                why="word embeddings of another width than hidden_size need projections into and out of the stream "
                    "(project_in, project_out), which specformer lacks")
    bias = bool(cfg.get("enable_bias"))
    affine = bool(cfg.get("layer_norm_elementwise_affine"))
    norm: dict[str, Any] = {"kind": "layernorm", "eps": EPS}
    if not affine:
        norm["affine"] = False
    return {
        "vocab_size": cfg.get_int("vocab_size"),
        "d_model": d_model,
        "n_layers": cfg.get_layers("num_hidden_layers"),
        "context_length": cfg.get_int("max_position_embeddings"),
        "tie_embeddings": bool(cfg.get("tie_word_embeddings")),
        "positional": {"kind": "learned", "offset": OFFSET},
        "block": {
            "layout": "prenorm",
            "norm": norm,
            "mixer": {"kind": "attention", "n_heads": cfg.get_size("num_attention_heads"), "qkv_bias": bias,
                      "out_bias": bias},
            "ffn": {"kind": "mlp", "hidden": cfg.get_size("ffn_dim"),
                    "activation": activation_from_hf(cfg, "activation_function"), "bias": bias},
        },
    }


def to_config(view: SpecView) -> dict[str, Any]:
    m = view.model
    pos = view.expect(view.positional, "model.positional", ("learned",), family=NAME)
    if pos.get("offset") != OFFSET:
        raise NotExpressible("model.positional.offset", f"{pos.get('offset')}: Hugging Face {NAME}'s position table "
                             f"starts at row {OFFSET}")
    view.block_kind("layout", ("prenorm",), family=NAME)
    view.block_kind("norm", ("layernorm",), family=NAME)
    view.block_kind("mixer", ("attention",), family=NAME)
    view.block_kind("ffn", ("mlp",), family=NAME)
    if m.lm_head_bias:
        raise NotExpressible("model.lm_head_bias", f"Hugging Face {NAME} has no LM head bias")
    n_heads = view.multi_head(family=NAME)
    bias = view.uniform("ffn", "bias", family=NAME)
    if view.uniform("mixer", "qkv_bias", family=NAME) != bias or view.uniform("mixer", "out_bias", family=NAME) != bias:
        raise NotExpressible("model.block.mixer.qkv_bias", f"Hugging Face {NAME} switches the attention's and the "
                             "MLP's biases together (enable_bias)")
    affine = view.uniform("norm", "affine", family=NAME)
    if view.uniform("norm", "eps", family=NAME) != EPS or (affine and not view.uniform("norm", "bias", family=NAME)):
        raise NotExpressible("model.block.norm", f"Hugging Face {NAME}'s LayerNorms have eps {EPS:g} and, when "
                             "affine, a bias")
    return {
        "vocab_size": m.vocab_size,
        "hidden_size": m.d_model,
        "num_hidden_layers": m.n_layers,
        "ffn_dim": view.uniform("ffn", "hidden", family=NAME) or 4 * m.d_model,  # the mlp default
        "max_position_embeddings": m.context_length,
        "do_layer_norm_before": True,
        "word_embed_proj_dim": m.d_model,
        "num_attention_heads": n_heads,
        "activation_function": ACTIVATIONS_TO_HF[view.uniform("ffn", "activation", family=NAME)],
        "enable_bias": bias,
        "layer_norm_elementwise_affine": affine,
        "tie_word_embeddings": m.tie_embeddings,
    }


LAYER = "model.decoder.layers.{i}"

WEIGHTS = [
    Copy("model.decoder.embed_tokens.weight", "embedding.weight"),
    Copy("model.decoder.embed_positions.weight", "positional.table.weight"),
    *fairseq_layer_rules(LAYER),
    Copy("model.decoder.final_layer_norm.weight", "final_norm.weight"),
    Copy("model.decoder.final_layer_norm.bias", "final_norm.bias"),
    Copy("lm_head.weight", "lm_head.weight"),
]

FAMILY = Family(
    name=NAME,
    model_type="opt",
    architecture="OPTForCausalLM",
    defaults=DEFAULTS,
    to_spec=to_spec,
    to_config=to_config,
    weights=WEIGHTS,
    # The published checkpoints were saved from OPTModel: "decoder.*" without "model.".
    aliases=(("model.", ""),),
    # Training-only settings (dropout, layer drop, init) and the tokenizer's prefix in the first configs.
    non_math_fields=("dropout", "activation_dropout", "layerdrop", "init_std", "prefix"),
    maps="learned positions with offset 2 (max_position_embeddings + 2 rows), pre-norm LayerNorm "
         "(layer_norm_elementwise_affine -> affine), enable_bias -> q/k/v/out_proj and fc1/fc2 biases, ffn_dim, "
         "activation_function (ReLU) MLP",
    caveats="multi-head attention only; post-norm OPT (do_layer_norm_before false, OPT-350m) and _remove_final_layer_norm "
            "are refused (no final LayerNorm), as is word_embed_proj_dim other than hidden_size (project_in/project_out)",
)
