"""MPT (``model_type: mpt``, MosaicML): ALiBi positions, bias-free LayerNorms and projections, one fused Wqkv,
a GELU MLP of four times the width; the attention settings sit in a nested ``attn_config``."""

from __future__ import annotations

from typing import Any

from specformer.errors import UserError

from specformer_hf.config import ConfigReader
from specformer_hf.family import Family
from specformer_hf.parts.base import BLOCK_MIXER
from specformer_hf.parts.embedding import no_output_bias
from specformer_hf.rules import Copy, Rule
from specformer_hf.specview import NotExpressible, SpecView

NAME = "MPT"

#: transformers' MptAttentionConfig defaults (the nested ``attn_config``).
ATTN_DEFAULTS = {
    "attn_type": "multihead_attention", "attn_pdrop": 0, "attn_impl": "torch", "clip_qkv": None, "softmax_scale": None,
    "prefix_lm": False, "qk_ln": False, "attn_uses_sequence_id": False, "alibi": True, "alibi_bias_max": 8,
}

#: transformers' MptConfig defaults (its docstring's checkpoint is mosaicml/mpt-7b, but these sizes are MPT-1B's:
#: hidden 2048, 24 layers, 16 heads; MPT-7B's are in specs/mpt-7b.yaml).
DEFAULTS = {
    "d_model": 2048, "n_heads": 16, "n_layers": 24, "expansion_ratio": 4, "max_seq_len": 2048, "vocab_size": 50368,
    "layer_norm_epsilon": 1e-5, "learned_pos_emb": True, "attn_config": None, "logit_scale": None, "no_bias": True,
    "norm_type": "low_precision_layernorm", "tie_word_embeddings": True,
}

#: Why each refused setting is refused: what transformers' MPT does instead, or the mechanism specformer lacks.
_WHY = {
    "qk_ln": "transformers' MPT does not build the q/k LayerNorms it asks for",
    "alibi": "transformers' MPT always adds ALiBi biases and has no other positions",
    "alibi_bias_max": "specformer's alibi has the slopes of a maximum bias of 8 (2^(-8/n) for n heads)",
    "attn_type": "transformers' MPT always has one key and one value head per query head",
    "prefix_lm": "transformers' MPT is always causal",
    "attn_uses_sequence_id": "transformers' MPT does not read token_type_ids",
}


def _attention(cfg: ConfigReader) -> dict[str, Any]:
    """The attention settings out of ``attn_config``; what it holds beyond them is reported like top-level fields."""
    data = cfg.get("attn_config")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"{cfg.family}: config field 'attn_config' must be a mapping of attention settings, got {data!r}")
    inner = ConfigReader(data, defaults=ATTN_DEFAULTS, family=f"{cfg.family} attn_config")
    inner.require("qk_ln", (False,), why=_WHY["qk_ln"])
    inner.require("alibi", (True,), why=_WHY["alibi"])
    inner.require("alibi_bias_max", (8,), why=_WHY["alibi_bias_max"])
    inner.require("attn_type", ("multihead_attention",), why=_WHY["attn_type"])
    inner.require("prefix_lm", (False,), why=_WHY["prefix_lm"])
    inner.require("attn_uses_sequence_id", (False,), why=_WHY["attn_uses_sequence_id"])
    scale = inner.get("softmax_scale")
    if scale is not None:
        scale = inner.get_float("softmax_scale")
    # transformers clamps the fused Wqkv output when clip_qkv is truthy: null and 0 both leave it as it is.
    clip = inner.get_float("clip_qkv") if inner.get("clip_qkv") else None
    inner.mark_read("attn_pdrop", "attn_impl")  # dropout and the kernel choice: not the maths
    cfg.unused.extend(f"attn_config.{key}" for key in inner.unread())
    return {"scale": scale, "clip_qkv": clip}


def to_spec(cfg: ConfigReader) -> dict[str, Any]:
    cfg.require("expansion_ratio", (4,), why="transformers' MPT always builds its MLP four times as wide as d_model")
    cfg.require("no_bias", (True,), why="transformers' MPT has no biases on its projections and LayerNorms")
    cfg.require("logit_scale", (None,), why="transformers' MPT does not scale its logits")
    # transformers ignores learned_pos_emb (MPT's own code adds no learned positions under ALiBi either) and norm_type
    # (every MPT's LayerNorm is the same; "low_precision" only chose the dtype it ran in on GPUs).
    cfg.mark_read("learned_pos_emb", "norm_type")
    attention = _attention(cfg)
    d_model, n_heads = cfg.get_width_and_heads("d_model", "n_heads", model="MPT")
    attn: dict[str, Any] = {"kind": "attention", "n_heads": n_heads, "n_kv_heads": n_heads, "qkv_bias": False,
                            "out_bias": False}
    for key in ("scale", "clip_qkv"):
        if attention[key] is not None:
            attn[key] = attention[key]
    return {
        "vocab_size": cfg.get_int("vocab_size"),
        "d_model": d_model,
        "n_layers": cfg.get_layers("n_layers"),
        "context_length": cfg.get_int("max_seq_len"),
        "tie_embeddings": bool(cfg.get("tie_word_embeddings")),
        "positional": {"kind": "alibi"},
        "block": {
            "layout": "prenorm",
            "norm": {"kind": "layernorm", "eps": cfg.get_float("layer_norm_epsilon"), "bias": False},
            "mixer": attn,
            "ffn": {"kind": "mlp", "hidden": 4 * d_model, "activation": "gelu", "bias": False},
        },
    }


def to_config(view: SpecView) -> dict[str, Any]:
    m = view.model
    no_output_bias(view, NAME)
    if view.positional["kind"] != "alibi" or any(p is not None and p["kind"] != "alibi"
                                                 for p in view.per_layer("positional")):
        raise NotExpressible("model.positional.kind", f"Hugging Face {NAME} has ALiBi positions in every layer")
    view.block_kind("layout", ("prenorm",), family=NAME)
    view.block_kind("norm", ("layernorm",), family=NAME)
    view.block_kind("mixer", ("attention",), family=NAME)
    view.block_kind("ffn", ("mlp",), family=NAME)
    if view.uniform("norm", "bias", family=NAME) or not view.uniform("norm", "affine", family=NAME):
        raise NotExpressible("model.block.norm", f"Hugging Face {NAME}'s LayerNorms have a weight and no bias")
    n_heads = view.multi_head(family=NAME)
    if any(view.uniform("mixer", key, family=NAME) for key in ("qkv_bias", "out_bias")) \
            or view.uniform("ffn", "bias", family=NAME):
        raise NotExpressible("model.block", f"Hugging Face {NAME} has no biases")
    if (view.uniform("ffn", "hidden", family=NAME) or 4 * m.d_model) != 4 * m.d_model:
        raise NotExpressible("model.block.ffn.hidden", f"Hugging Face {NAME}'s MLP is always 4 x d_model "
                             f"({4 * m.d_model}) wide")
    if view.uniform("ffn", "activation", family=NAME) != "gelu":
        raise NotExpressible("model.block.ffn.activation", f"Hugging Face {NAME}'s MLP is always exact GELU (gelu)")
    clip = view.uniform("mixer", "clip_qkv", family=NAME)
    if clip is not None and view.uniform("mixer", "clip_qkv_order", family=NAME) != "after_projection":
        raise NotExpressible("model.block.mixer.clip_qkv_order", f"Hugging Face {NAME} clamps the fused q/k/v right "
                             "after Wqkv (clip_qkv_order: after_projection)")
    return {
        "vocab_size": m.vocab_size,
        "d_model": m.d_model,
        "n_layers": m.n_layers,
        "n_heads": n_heads,
        "max_seq_len": m.context_length,
        "expansion_ratio": 4,
        "no_bias": True,
        "logit_scale": None,
        "tie_word_embeddings": m.tie_embeddings,
        "layer_norm_epsilon": view.uniform("norm", "eps", family=NAME),
        "attn_config": {**ATTN_DEFAULTS, "softmax_scale": view.uniform("mixer", "scale", family=NAME), "clip_qkv": clip},
    }


LAYER = "transformer.blocks.{i}"

WEIGHTS: list[Rule] = [
    Copy("transformer.wte.weight", "embedding.weight"),
    Copy(f"{LAYER}.norm_1.weight", "blocks.{i}.attention_norm.weight"),
    # Wqkv's rows are [q (all heads); k; v], ours already.
    Copy(f"{LAYER}.attn.Wqkv.weight", f"{BLOCK_MIXER}.qkv.weight"),
    Copy(f"{LAYER}.attn.out_proj.weight", f"{BLOCK_MIXER}.out.weight"),
    Copy(f"{LAYER}.norm_2.weight", "blocks.{i}.ffn_norm.weight"),
    Copy(f"{LAYER}.ffn.up_proj.weight", "blocks.{i}.ffn.fc_in.weight"),
    Copy(f"{LAYER}.ffn.down_proj.weight", "blocks.{i}.ffn.fc_out.weight"),
    Copy("transformer.norm_f.weight", "final_norm.weight"),
    Copy("lm_head.weight", "lm_head.weight"),
]

FAMILY = Family(
    name=NAME,
    model_type="mpt",
    architecture="MptForCausalLM",
    defaults=DEFAULTS,
    to_spec=to_spec,
    to_config=to_config,
    weights=WEIGHTS,
    # Dropout, the device the original code initialised on, and a gradient scale on the embedding (training only).
    non_math_fields=("emb_pdrop", "init_device", "embedding_fraction"),
    maps="alibi positions (attn_config.alibi_bias_max 8); prenorm LayerNorms without biases (no_bias); Wqkv as our "
         "fused qkv; attn_config.softmax_scale -> mixer.scale; attn_config.clip_qkv -> mixer.clip_qkv (the fused q/k/v "
         "clamped after Wqkv; 0 as null: no clamping); no biases; a GELU MLP of 4 x d_model (up_proj, "
         "down_proj); max_seq_len as the context; tied or untied head",
    caveats="refused: alibi_bias_max other than 8, and the settings "
            "transformers' MPT does not run (qk_ln, prefix_lm, multi-query attn_type, attn_uses_sequence_id, "
            "logit_scale, biases, expansion_ratio other than 4)",
)
