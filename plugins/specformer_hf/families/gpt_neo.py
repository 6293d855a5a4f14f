"""GPT-Neo (``model_type: gpt_neo``): GPT-2's blocks with nn.Linear weights, global and local (sliding-window) attention
layers as attention_types lists them, unscaled attention scores, bias-free q/k/v."""

from __future__ import annotations

from typing import Any

from specformer.errors import UserError

from specformer_hf.config import ACTIVATIONS_TO_HF, ConfigReader, activation_from_hf
from specformer_hf.family import Family
from specformer_hf.parts.base import BLOCK_MIXER
from specformer_hf.parts.windows import single_window, windowed
from specformer_hf.rules import Copy, Fused, qkv_sizes
from specformer_hf.specview import NotExpressible, SpecView

NAME = "GPT-Neo"

#: transformers' GPTNeoConfig defaults (GPT-Neo 1.3B's sizes).
DEFAULTS = {
    "vocab_size": 50257, "max_position_embeddings": 2048, "hidden_size": 2048, "num_layers": 24,
    "attention_types": [[["global", "local"], 12]], "num_heads": 16, "intermediate_size": None, "window_size": 256,
    "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True,
}

LAYER_KINDS = ("global", "local")


def layer_kinds(cfg: ConfigReader, n_layers: int) -> list[str]:
    """attention_types ``[[kinds, repeats], ...]`` spelled out per layer, as GPTNeoConfig expands it."""
    types = cfg.get("attention_types")
    kinds: list[str] = []
    try:
        for pattern, repeats in types:
            kinds += list(pattern) * repeats
    except (TypeError, ValueError):
        raise UserError(f"{cfg.family}: config field 'attention_types' = {types!r} is not a list of [[kinds...], "
                        "repeats] pairs") from None
    bad = sorted({str(k) for k in kinds if k not in LAYER_KINDS})
    if bad or len(kinds) != n_layers:
        raise UserError(f"{cfg.family}: config field 'attention_types' = {types!r} must give 'global' or 'local' for "
                        f"each of the {n_layers} layers" + (f" (not {', '.join(bad)})" if bad else f", not {len(kinds)}"))
    return kinds


def attention_types(kinds: list[str]) -> list[list[Any]]:
    """The shortest repeating ``[[pattern, repeats]]`` that spells out ``kinds``."""
    n = len(kinds)
    period = next(p for p in range(1, n + 1) if n % p == 0 and kinds == kinds[:p] * (n // p))
    return [[kinds[:period], n // period]]


def to_spec(cfg: ConfigReader) -> dict[str, Any]:
    d_model, n_heads, n_layers = cfg.get_size("hidden_size"), cfg.get_size("num_heads"), cfg.get_layers("num_layers")
    kinds = layer_kinds(cfg, n_layers)
    # GPTNeoConfig derives attention_layers from attention_types (and saves both); window_size matters only when local.
    cfg.mark_read("attention_layers", "window_size")
    window = cfg.get_size("window_size") if "local" in kinds else None
    model: dict[str, Any] = {
        "vocab_size": cfg.get_int("vocab_size"),
        "d_model": d_model,
        "n_layers": n_layers,
        "context_length": cfg.get_int("max_position_embeddings"),
        "tie_embeddings": bool(cfg.get("tie_word_embeddings")),
        "positional": {"kind": "learned"},
        "block": {
            "layout": "prenorm",
            "norm": {"kind": "layernorm", "eps": cfg.get_float("layer_norm_epsilon")},
            # GPTNeoSelfAttention never scales its scores by 1/sqrt(head_dim).
            "mixer": {"kind": "attention", "n_heads": n_heads, "qkv_bias": False, "out_bias": True, "scale": 1.0},
            "ffn": {"kind": "mlp", "hidden": cfg.get("intermediate_size") or 4 * d_model,
                    "activation": activation_from_hf(cfg, "activation_function"), "bias": True},
        },
    }
    windowed(model, [window if kind == "local" else None for kind in kinds])
    return model


def to_config(view: SpecView) -> dict[str, Any]:
    m = view.model
    pos = view.expect(view.positional, "model.positional", ("learned",), family=NAME)
    if pos.get("offset"):
        raise NotExpressible("model.positional.offset", f"{pos['offset']}: Hugging Face {NAME}'s position table starts "
                             "at row 0")
    view.block_kind("layout", ("prenorm",), family=NAME)
    view.block_kind("norm", ("layernorm",), family=NAME)
    view.block_kind("mixer", ("attention",), family=NAME)
    view.block_kind("ffn", ("mlp",), family=NAME)
    if m.lm_head_bias:
        raise NotExpressible("model.lm_head_bias", f"Hugging Face {NAME} has no LM head bias")
    n_heads = view.multi_head(family=NAME)
    if view.uniform("mixer", "scale", family=NAME) != 1.0:
        raise NotExpressible("model.block.mixer.scale", f"Hugging Face {NAME} never scales attention scores "
                             "(scale: 1)")
    window = single_window(view, NAME)
    kinds = ["local" if w is not None else "global" for w in view.per_layer("mixer", "window")]
    return {
        "vocab_size": m.vocab_size,
        "max_position_embeddings": m.context_length,
        "hidden_size": m.d_model,
        "num_layers": m.n_layers,
        "attention_types": attention_types(kinds),
        "num_heads": n_heads,
        "intermediate_size": view.uniform("ffn", "hidden", family=NAME) or 4 * m.d_model,
        "window_size": window if window is not None else DEFAULTS["window_size"],
        "activation_function": ACTIVATIONS_TO_HF[view.uniform("ffn", "activation", family=NAME)],
        "layer_norm_epsilon": view.uniform("norm", "eps", family=NAME),
        "tie_word_embeddings": m.tie_embeddings,
    }


LAYER = "transformer.h.{i}"
ATTN = f"{LAYER}.attn.attention"

WEIGHTS = [
    Copy("transformer.wte.weight", "embedding.weight"),
    Copy("transformer.wpe.weight", "positional.table.weight"),
    Copy(f"{LAYER}.ln_1.weight", "blocks.{i}.attention_norm.weight"),
    Copy(f"{LAYER}.ln_1.bias", "blocks.{i}.attention_norm.bias"),
    Fused([f"{ATTN}.q_proj.weight", f"{ATTN}.k_proj.weight", f"{ATTN}.v_proj.weight"], f"{BLOCK_MIXER}.qkv.weight",
          sizes=qkv_sizes),
    Copy(f"{ATTN}.out_proj.weight", f"{BLOCK_MIXER}.out.weight"),
    Copy(f"{ATTN}.out_proj.bias", f"{BLOCK_MIXER}.out.bias"),
    Copy(f"{LAYER}.ln_2.weight", "blocks.{i}.ffn_norm.weight"),
    Copy(f"{LAYER}.ln_2.bias", "blocks.{i}.ffn_norm.bias"),
    Copy(f"{LAYER}.mlp.c_fc.weight", "blocks.{i}.ffn.fc_in.weight"),
    Copy(f"{LAYER}.mlp.c_fc.bias", "blocks.{i}.ffn.fc_in.bias"),
    Copy(f"{LAYER}.mlp.c_proj.weight", "blocks.{i}.ffn.fc_out.weight"),
    Copy(f"{LAYER}.mlp.c_proj.bias", "blocks.{i}.ffn.fc_out.bias"),
    Copy("transformer.ln_f.weight", "final_norm.weight"),
    Copy("transformer.ln_f.bias", "final_norm.bias"),
    Copy("lm_head.weight", "lm_head.weight"),
]

FAMILY = Family(
    name=NAME,
    model_type="gpt_neo",
    architecture="GPTNeoForCausalLM",
    defaults=DEFAULTS,
    to_spec=to_spec,
    to_config=to_config,
    weights=WEIGHTS,
    # Old checkpoints carry the (local) causal masks as buffers; base-model files have no "transformer." prefix.
    ignore_tensors=(r"(transformer\.)?h\.\d+\.attn\.attention\.(bias|masked_bias)",),
    aliases=(("transformer.", ""),),
    non_math_fields=("embed_dropout", "resid_dropout", "gradient_checkpointing"),
    maps="learned positions (max_position_embeddings), LayerNorm, attention_types -> global layers and local ones with "
         "a window of window_size, scores unscaled (scale 1), q/k/v without biases, out_proj with one, GELU MLP "
         "(intermediate_size) with biases",
    caveats="multi-head attention only; a key is visible to a local query when query - key < window_size",
)
