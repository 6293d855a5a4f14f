"""GPT-1 (``model_type: openai-gpt``, openai-community/openai-gpt): learned positions, post-norm LayerNorm blocks
and no final norm (``final_norm: none``), fused c_attn (Conv1D), a GELU MLP four times as wide, biases everywhere."""

from __future__ import annotations

from typing import Any

from specformer_hf.config import ConfigReader
from specformer_hf.family import Family
from specformer_hf.parts.base import BLOCK_MIXER
from specformer_hf.parts.embedding import no_output_bias
from specformer_hf.rules import Copy, Rule, Transposed
from specformer_hf.specview import NotExpressible, SpecView

NAME = "GPT-1"

#: transformers' OpenAIGPTConfig defaults (openai-gpt's own sizes).
DEFAULTS = {
    "vocab_size": 40478, "n_positions": 512, "n_embd": 768, "n_layer": 12, "n_head": 12, "afn": "gelu",
    "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True,
}

#: transformers' OpenAIGPT ACT_FNS -> ours: its "gelu" is gelu_new, the tanh approximation.
ACTIVATIONS = {"gelu": "gelu_tanh", "relu": "relu", "silu": "silu", "swish": "silu"}
ACTIVATIONS_TO_HF = {"gelu_tanh": "gelu", "relu": "relu", "silu": "silu"}


def to_spec(cfg: ConfigReader) -> dict[str, Any]:
    d_model, n_heads = cfg.get_width_and_heads("n_embd", "n_head", model="GPT-1")
    afn = cfg.require("afn", tuple(ACTIVATIONS), why="transformers' OpenAIGPT knows only these activations")
    norm = {"kind": "layernorm", "eps": cfg.get_float("layer_norm_epsilon")}
    return {
        "vocab_size": cfg.get_int("vocab_size"),
        "d_model": d_model,
        "n_layers": cfg.get_layers("n_layer"),
        "context_length": cfg.get_int("n_positions"),
        "tie_embeddings": bool(cfg.get("tie_word_embeddings")),
        "positional": {"kind": "learned"},
        # The blocks end with their own LayerNorm (post-norm): nothing more before the head.
        "final_norm": {"kind": "none"},
        "block": {
            "layout": "postnorm",
            "norm": norm,
            "mixer": {"kind": "attention", "n_heads": n_heads, "n_kv_heads": n_heads, "qkv_bias": True,
                      "out_bias": True},
            "ffn": {"kind": "mlp", "hidden": 4 * d_model, "activation": ACTIVATIONS[afn], "bias": True},
        },
    }


def to_config(view: SpecView) -> dict[str, Any]:
    m = view.model
    no_output_bias(view, NAME)
    view.expect(view.positional, "model.positional", ("learned",), family=NAME)
    view.expect(view.final_norm, "model.final_norm", ("none",), family=NAME)
    view.block_kind("layout", ("postnorm",), family=NAME)
    view.block_kind("norm", ("layernorm",), family=NAME)
    view.block_kind("mixer", ("attention",), family=NAME)
    view.block_kind("ffn", ("mlp",), family=NAME)
    n_heads = view.multi_head(family=NAME)
    if (view.uniform("ffn", "hidden", family=NAME) or 4 * m.d_model) != 4 * m.d_model:
        raise NotExpressible("model.block.ffn.hidden", f"Hugging Face {NAME}'s MLP is always 4 x d_model "
                             f"({4 * m.d_model}) wide")
    activation = view.uniform("ffn", "activation", family=NAME)
    if activation not in ACTIVATIONS_TO_HF:
        raise NotExpressible("model.block.ffn.activation", f"{activation!r} has no equivalent in Hugging Face {NAME} "
                             f"(which has {', '.join(repr(a) for a in ACTIVATIONS_TO_HF)})")
    # The biases and the score scale: any other value reads back otherwise and export names it.
    return {
        "vocab_size": m.vocab_size,
        "n_positions": m.context_length,
        "n_embd": m.d_model,
        "n_layer": m.n_layers,
        "n_head": n_heads,
        "afn": ACTIVATIONS_TO_HF[activation],
        "layer_norm_epsilon": view.uniform("norm", "eps", family=NAME),
        "tie_word_embeddings": m.tie_embeddings,
    }


LAYER = "transformer.h.{i}"

WEIGHTS: list[Rule] = [
    Copy("transformer.tokens_embed.weight", "embedding.weight"),
    Copy("transformer.positions_embed.weight", "positional.table.weight"),
    # c_attn's output columns are [q | k | v], the same order as our fused qkv rows (as GPT-2's).
    Transposed(f"{LAYER}.attn.c_attn.weight", f"{BLOCK_MIXER}.qkv.weight"),
    Copy(f"{LAYER}.attn.c_attn.bias", f"{BLOCK_MIXER}.qkv.bias"),
    Transposed(f"{LAYER}.attn.c_proj.weight", f"{BLOCK_MIXER}.out.weight"),
    Copy(f"{LAYER}.attn.c_proj.bias", f"{BLOCK_MIXER}.out.bias"),
    # Post-norm: ln_1 after the attention's residual add, ln_2 after the MLP's.
    Copy(f"{LAYER}.ln_1.weight", "blocks.{i}.attention_norm.weight"),
    Copy(f"{LAYER}.ln_1.bias", "blocks.{i}.attention_norm.bias"),
    Transposed(f"{LAYER}.mlp.c_fc.weight", "blocks.{i}.ffn.fc_in.weight"),
    Copy(f"{LAYER}.mlp.c_fc.bias", "blocks.{i}.ffn.fc_in.bias"),
    Transposed(f"{LAYER}.mlp.c_proj.weight", "blocks.{i}.ffn.fc_out.weight"),
    Copy(f"{LAYER}.mlp.c_proj.bias", "blocks.{i}.ffn.fc_out.bias"),
    Copy(f"{LAYER}.ln_2.weight", "blocks.{i}.ffn_norm.weight"),
    Copy(f"{LAYER}.ln_2.bias", "blocks.{i}.ffn_norm.bias"),
    Copy("lm_head.weight", "lm_head.weight"),
]

FAMILY = Family(
    name=NAME,
    model_type="openai-gpt",
    architecture="OpenAIGPTLMHeadModel",
    defaults=DEFAULTS,
    to_spec=to_spec,
    to_config=to_config,
    weights=WEIGHTS,
    aliases=(("transformer.", ""),),
    non_math_fields=("resid_pdrop", "embd_pdrop", "attn_pdrop"),
    maps="learned positions (n_positions); layout postnorm with LayerNorms (ln_1, ln_2) and final_norm none; fused "
         "c_attn (Conv1D, transposed); biases on every projection; an MLP of 4 x n_embd, afn gelu as gelu_tanh "
         "(transformers' gelu_new), relu, silu/swish",
    caveats="multi-head attention only; masked scores are -10000 in transformers (not -inf), which gives the same "
            "softmax unless a score is that large",
)
