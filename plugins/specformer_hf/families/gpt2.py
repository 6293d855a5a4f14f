"""GPT-2 (``model_type: gpt2``): learned positions, pre-norm LayerNorm, fused c_attn, GELU MLP, Conv1D weights."""

from __future__ import annotations

import math
from typing import Any

from specformer_hf.parts.base import BLOCK_MIXER
from specformer_hf.config import ACTIVATIONS_TO_HF, ConfigReader, activation_from_hf
from specformer_hf.family import Family
from specformer_hf.rules import Copy, Transposed
from specformer_hf.specview import NotExpressible, SpecView

NAME = "GPT-2"

#: transformers' GPT2Config defaults.
DEFAULTS = {
    "vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None,
    "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False, "tie_word_embeddings": True, "add_cross_attention": False,
}


def layer_scales(scale_weights: bool, by_layer: bool, n_layers: int, head_dim: int) -> list[float]:
    """GPT2Attention's score scale per layer: 1/sqrt(head_dim) (or 1), divided by layer + 1 if asked."""
    base = head_dim ** -0.5 if scale_weights else 1.0
    return [base / float(i + 1) if by_layer else base for i in range(n_layers)]


def to_spec(cfg: ConfigReader) -> dict[str, Any]:
    cfg.require("add_cross_attention", (False,), why="GPT-2 with cross-attention is an encoder-decoder's decoder")
    d_model, n_heads, n_layers = cfg.get_size("n_embd"), cfg.get_size("n_head"), cfg.get_layers("n_layer")
    scales = layer_scales(bool(cfg.get("scale_attn_weights")), bool(cfg.get("scale_attn_by_inverse_layer_idx")),
                          n_layers, d_model // n_heads)
    attention: dict[str, Any] = {"kind": "attention", "n_heads": n_heads, "qkv_bias": True, "out_bias": True}
    spec: dict[str, Any] = {
        "vocab_size": cfg.get_int("vocab_size"),
        "d_model": d_model,
        "n_layers": n_layers,
        "context_length": cfg.get_int("n_positions"),
        "tie_embeddings": bool(cfg.get("tie_word_embeddings")),
        "positional": {"kind": "learned"},
        "block": {
            "layout": "prenorm",
            "norm": {"kind": "layernorm", "eps": cfg.get_float("layer_norm_epsilon")},
            "mixer": attention,
            "ffn": {"kind": "mlp", "hidden": cfg.get("n_inner") or 4 * d_model,
                    "activation": activation_from_hf(cfg, "activation_function"), "bias": True},
        },
    }
    if len(set(scales)) == 1:
        if scales[0] != (d_model // n_heads) ** -0.5:
            attention["scale"] = scales[0]
    else:
        spec["layers"] = [{"select": i, "mixer": {"scale": s}} for i, s in enumerate(scales)]
    return spec


def to_config(view: SpecView) -> dict[str, Any]:
    m = view.model
    view.expect(view.positional, "model.positional", ("learned",), family=NAME)
    view.block_kind("layout", ("prenorm",), family=NAME)
    view.block_kind("norm", ("layernorm",), family=NAME)
    view.block_kind("mixer", ("attention",), family=NAME)
    view.block_kind("ffn", ("mlp",), family=NAME)
    if m.lm_head_bias:
        raise NotExpressible("model.lm_head_bias", "Hugging Face GPT-2 has no LM head bias")
    _, _, head_dim = view.attention_sizes()
    scales = [s if s is not None else head_dim ** -0.5 for s in view.per_layer("mixer", "scale")]
    for scale_weights in (True, False):
        for by_layer in (False, True):
            if all(math.isclose(a, b, rel_tol=1e-12) for a, b in zip(scales, layer_scales(scale_weights, by_layer, m.n_layers, head_dim))):
                break
        else:
            continue
        break
    else:
        raise NotExpressible(
            "model.block.mixer.scale",
            f"per-layer scales {scales} are neither 1/sqrt(head_dim) nor 1, optionally divided by layer + 1, as GPT-2 allows",
        )
    return {
        "vocab_size": m.vocab_size,
        "n_positions": m.context_length,
        "n_embd": m.d_model,
        "n_layer": m.n_layers,
        "n_head": view.uniform("mixer", "n_heads", family=NAME),
        "n_inner": view.uniform("ffn", "hidden", family=NAME) or 4 * m.d_model,
        "activation_function": ACTIVATIONS_TO_HF[view.uniform("ffn", "activation", family=NAME)],
        "layer_norm_epsilon": view.uniform("norm", "eps", family=NAME),
        "scale_attn_weights": scale_weights,
        "scale_attn_by_inverse_layer_idx": by_layer,
        "tie_word_embeddings": m.tie_embeddings,
    }


WEIGHTS = [
    Copy("transformer.wte.weight", "embedding.weight"),
    Copy("transformer.wpe.weight", "positional.table.weight"),
    Copy("transformer.h.{i}.ln_1.weight", "blocks.{i}.attention_norm.weight"),
    Copy("transformer.h.{i}.ln_1.bias", "blocks.{i}.attention_norm.bias"),
    # c_attn's output columns are [q | k | v], the same order as our fused qkv rows.
    Transposed("transformer.h.{i}.attn.c_attn.weight", f"{BLOCK_MIXER}.qkv.weight"),
    Copy("transformer.h.{i}.attn.c_attn.bias", f"{BLOCK_MIXER}.qkv.bias"),
    Transposed("transformer.h.{i}.attn.c_proj.weight", f"{BLOCK_MIXER}.out.weight"),
    Copy("transformer.h.{i}.attn.c_proj.bias", f"{BLOCK_MIXER}.out.bias"),
    Copy("transformer.h.{i}.ln_2.weight", "blocks.{i}.ffn_norm.weight"),
    Copy("transformer.h.{i}.ln_2.bias", "blocks.{i}.ffn_norm.bias"),
    Transposed("transformer.h.{i}.mlp.c_fc.weight", "blocks.{i}.ffn.fc_in.weight"),
    Copy("transformer.h.{i}.mlp.c_fc.bias", "blocks.{i}.ffn.fc_in.bias"),
    Transposed("transformer.h.{i}.mlp.c_proj.weight", "blocks.{i}.ffn.fc_out.weight"),
    Copy("transformer.h.{i}.mlp.c_proj.bias", "blocks.{i}.ffn.fc_out.bias"),
    Copy("transformer.ln_f.weight", "final_norm.weight"),
    Copy("transformer.ln_f.bias", "final_norm.bias"),
    Copy("lm_head.weight", "lm_head.weight"),
]

FAMILY = Family(
    name=NAME,
    model_type="gpt2",
    architecture="GPT2LMHeadModel",
    defaults=DEFAULTS,
    to_spec=to_spec,
    to_config=to_config,
    weights=WEIGHTS,
    # Old checkpoints carry the causal mask as a buffer; base-model files have no "transformer." prefix.
    ignore_tensors=(r"(transformer\.)?h\.\d+\.attn\.(bias|masked_bias)",),
    aliases=(("transformer.", ""),),
    non_math_fields=("n_ctx",),
    maps="learned positions (n_positions), LayerNorm, fused c_attn (Conv1D, transposed), GELU MLP (n_inner), "
         "scale_attn_weights and scale_attn_by_inverse_layer_idx as per-layer attention scales",
    caveats="multi-head attention only; gelu_new is the tanh GELU",
)
