"""GPT-J (``model_type: gptj``): parallel attention and MLP on one LayerNorm, interleaved rotary on the first
rotary_dim channels of each head, bias-free attention, an LM head with a bias."""

from __future__ import annotations

from typing import Any

from specformer.errors import UserError

from specformer_hf.parts.base import BLOCK_MIXER
from specformer_hf.config import ACTIVATIONS_TO_HF, ConfigReader, activation_from_hf
from specformer_hf.family import Family
from specformer_hf.rules import Copy, Fused, qkv_sizes
from specformer_hf.specview import NotExpressible, SpecView

NAME = "GPT-J"

#: transformers' GPTJConfig defaults (GPT-J-6B's sizes).
DEFAULTS = {
    "vocab_size": 50400, "n_positions": 2048, "n_embd": 4096, "n_layer": 28, "n_head": 16, "rotary_dim": 64,
    "n_inner": None, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "tie_word_embeddings": False,
}

#: GPTJRotaryEmbedding's base, fixed in its code (the config has no rope_theta).
THETA = 10000.0


def to_spec(cfg: ConfigReader, *, name: str = NAME) -> dict[str, Any]:
    """GPT-J's config as a spec; ``name``: the family whose config it is (CodeGen shares GPT-J's fields and maths)."""
    cfg.require("tie_word_embeddings", (False,),
                why=f"{name}'s LM head has a bias of its own, beside a tied weight not mapped by this family yet")
    d_model, n_heads = cfg.get_size("n_embd"), cfg.get_size("n_head")
    head_dim = d_model // n_heads
    rotary_dim = cfg.get("rotary_dim")
    if rotary_dim is None and n_heads == 1:
        rotary_dim = head_dim  # transformers rotates hidden_size channels: the whole (only) head
    if not isinstance(rotary_dim, int) or isinstance(rotary_dim, bool) or not 2 <= rotary_dim <= head_dim \
            or rotary_dim % 2 or int(head_dim * (rotary_dim / head_dim)) != rotary_dim:
        raise UserError(f"{cfg.family}: config field 'rotary_dim' = {rotary_dim!r} is not supported: it must be an even "
                        f"number of channels from 2 to the head size ({head_dim}), the channels of each head that rotate")
    return {
        "vocab_size": cfg.get_int("vocab_size"),
        "d_model": d_model,
        "n_layers": cfg.get_layers("n_layer"),
        "context_length": cfg.get_int("n_positions"),
        "tie_embeddings": False,
        "lm_head_bias": True,
        "positional": {"kind": "rope", "theta": THETA, "fraction": rotary_dim / head_dim, "interleaved": True},
        "block": {
            "layout": {"kind": "parallel", "shared_norm": True},
            "norm": {"kind": "layernorm", "eps": cfg.get_float("layer_norm_epsilon")},
            "mixer": {"kind": "attention", "n_heads": n_heads, "qkv_bias": False, "out_bias": False},
            "ffn": {"kind": "mlp", "hidden": cfg.get("n_inner") or 4 * d_model,
                    "activation": activation_from_hf(cfg, "activation_function"), "bias": True},
        },
    }


def to_config(view: SpecView, *, name: str = NAME) -> dict[str, Any]:
    """The GPT-J config of ``view``; ``name`` as in :func:`to_spec`."""
    m = view.model
    if not m.lm_head_bias:
        raise NotExpressible("model.lm_head_bias", f"Hugging Face {name}'s LM head always has a bias")
    pos = view.expect(view.positional, "model.positional", ("rope",), family=name)
    if not pos.get("interleaved"):
        raise NotExpressible("model.positional.interleaved", f"Hugging Face {name} always pairs adjacent channels "
                             "(interleaved: true)")
    if pos.get("theta") != THETA or pos.get("scaling"):
        raise NotExpressible("model.positional", f"Hugging Face {name}'s rotary has theta {THETA:g} and no scaling")
    view.block_kind("layout", ("parallel",), family=name)
    if not view.uniform("layout", "shared_norm", family=name):
        raise NotExpressible("model.block.layout.shared_norm", f"Hugging Face {name}'s parallel blocks share one norm")
    view.block_kind("norm", ("layernorm",), family=name)
    view.block_kind("mixer", ("attention",), family=name)
    view.block_kind("ffn", ("mlp",), family=name)
    n_heads, _, head_dim = view.attention_sizes()
    rotary_dim = int(head_dim * pos.get("fraction", 1.0))
    return {
        "vocab_size": m.vocab_size,
        "n_positions": m.context_length,
        "n_embd": m.d_model,
        "n_layer": m.n_layers,
        "n_head": n_heads,
        "rotary_dim": rotary_dim - rotary_dim % 2,  # as specformer's rope rounds it; the read-back compares the rest
        "n_inner": view.uniform("ffn", "hidden", family=name) or 4 * m.d_model,
        "activation_function": ACTIVATIONS_TO_HF[view.uniform("ffn", "activation", family=name)],
        "layer_norm_epsilon": view.uniform("norm", "eps", family=name),
        "tie_word_embeddings": False,
    }


LAYER = "transformer.h.{i}"

WEIGHTS = [
    Copy("transformer.wte.weight", "embedding.weight"),
    Copy(f"{LAYER}.ln_1.weight", "blocks.{i}.attention_norm.weight"),
    Copy(f"{LAYER}.ln_1.bias", "blocks.{i}.attention_norm.bias"),
    Fused([f"{LAYER}.attn.q_proj.weight", f"{LAYER}.attn.k_proj.weight", f"{LAYER}.attn.v_proj.weight"],
          f"{BLOCK_MIXER}.qkv.weight", sizes=qkv_sizes),
    Copy(f"{LAYER}.attn.out_proj.weight", f"{BLOCK_MIXER}.out.weight"),
    Copy(f"{LAYER}.mlp.fc_in.weight", "blocks.{i}.ffn.fc_in.weight"),
    Copy(f"{LAYER}.mlp.fc_in.bias", "blocks.{i}.ffn.fc_in.bias"),
    Copy(f"{LAYER}.mlp.fc_out.weight", "blocks.{i}.ffn.fc_out.weight"),
    Copy(f"{LAYER}.mlp.fc_out.bias", "blocks.{i}.ffn.fc_out.bias"),
    Copy("transformer.ln_f.weight", "final_norm.weight"),
    Copy("transformer.ln_f.bias", "final_norm.bias"),
    Copy("lm_head.weight", "lm_head.weight"),
    Copy("lm_head.bias", "lm_head.bias"),
]

FAMILY = Family(
    name=NAME,
    model_type="gptj",
    architecture="GPTJForCausalLM",
    defaults=DEFAULTS,
    to_spec=to_spec,
    to_config=to_config,
    weights=WEIGHTS,
    # Old checkpoints carry the causal mask and the rotary table as buffers.
    ignore_tensors=(r"transformer\.h\.\d+\.attn\.(bias|masked_bias|embed_positions)",),
    maps="layout parallel with one shared LayerNorm (ln_1), rope interleaved (adjacent pairs, theta 10000) on the "
         "first rotary_dim channels of each head, q/k/v/out_proj without biases, GELU MLP (fc_in, fc_out) with "
         "biases, LM head with a bias",
    caveats="multi-head attention only; the head cannot be tied (it has its own bias)",
)
