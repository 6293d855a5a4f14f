"""RecurrentGemma (``model_type: recurrent_gemma``, google/recurrentgemma-2b, -9b): Griffin's recurrent blocks and
local attention, two to one.

Every layer is a pre-normed block (Gemma's ``(1 + w)`` RMSNorms ``temporal_pre_norm`` and
``channel_pre_norm``) whose mixer repeats ``block_types`` (``recurrent, recurrent, attention``):
a recurrent layer is the ``rglru`` mixer (``lru_width`` channels, the gates in
``num_attention_heads`` blocks, a ``conv1d_width``-tap convolution), an attention layer is
grouped-query attention over a window of ``attention_window_size`` tokens with rope on the first
``partial_rotary_factor`` of each head and a bias on ``o_proj`` only. The feed-forward is a
GeLU-gated MLP with biases of width ``intermediate_size // 2``. The embeddings are scaled by
``sqrt(hidden_size)`` rounded to bfloat16 (transformers keeps that normaliser in bfloat16),
the logits soft-capped at ``logits_soft_cap``. The block holds the recurrent mixer, ``layers:``
overrides the attention layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from specformer.errors import UserError

from specformer_hf.config import ConfigReader
from specformer_hf.families.mamba2 import DEFAULT_CONTEXT, context_length
from specformer_hf.parts.attention import Attention
from specformer_hf.parts.base import BLOCK_MIXER, LAYER, FamilyView, Part, keeps_keys, keeps_state, selection, uniform_mixers
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.positions import Rope
from specformer_hf.rules import AtLayers, Copy, DepthwiseConv, Fused, Rule, halves, qkv_sizes
from specformer_hf.specview import NotExpressible

#: transformers' RecurrentGemmaConfig defaults (its docstring: the recurrentgemma-2b configuration).
DEFAULTS = {
    "num_hidden_layers": 26, "vocab_size": 256000, "hidden_size": 2560, "intermediate_size": 3 * 2560,
    "num_attention_heads": 10, "lru_width": None, "attention_window_size": 2048, "conv1d_width": 4,
    "logits_soft_cap": 30.0, "rms_norm_eps": 1e-6, "hidden_activation": "gelu_pytorch_tanh",
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    "block_types": ("recurrent", "recurrent", "attention"),
    "num_key_value_heads": None, "attention_bias": False, "tie_word_embeddings": True,
}
BLOCK = f"{LAYER}.temporal_block"
MLP = f"{LAYER}.mlp_block"
KINDS = {"recurrent": "rglru", "attention": "attention"}


def embedding_scale(d_model: int) -> float:
    """sqrt(d_model) as transformers' RecurrentGemma applies it: a bfloat16 constant."""
    return float(torch.tensor(math.sqrt(d_model), dtype=torch.bfloat16))


def layer_kinds(cfg: ConfigReader, n_layers: int) -> list[str]:
    """Each layer's kind, ``block_types`` repeated (transformers' layers_block_type)."""
    types = cfg.get("block_types")
    if not isinstance(types, (list, tuple)) or not types or any(t not in KINDS for t in types):
        raise UserError(f"{cfg.family}: block_types must list {' or '.join(KINDS)}, got {types!r}")
    return [KINDS[t] for t in (list(types) * n_layers)[:n_layers]]


@dataclass(frozen=True)
class RecurrentGemmaModel(Part):
    """The whole model: sizes, the embedding scale and logit cap, the norms, block_types and each kind's mixer, the MLP."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        n_layers = cfg.get_layers("num_hidden_layers")
        d_model = cfg.get_size("hidden_size")
        cfg.require("hidden_activation", ("gelu_pytorch_tanh",), why="RecurrentGemma's MLP and y branch use GeLU (tanh)")
        n_heads = cfg.get_size("num_attention_heads")
        model.update(vocab_size=cfg.get_int("vocab_size"), d_model=d_model, n_layers=n_layers,
                     context_length=context_length(cfg), tie_embeddings=bool(cfg.get("tie_word_embeddings")),
                     embedding_multiplier=embedding_scale(d_model), logit_softcap=cfg.get_float("logits_soft_cap"))
        Rope(partial=True).read(cfg, model)
        cfg.mark_read("partial_rotary_factor")  # transformers 4's place for it, folded into rope_parameters
        width = cfg.get("lru_width") or d_model
        recurrent = {"kind": "rglru", "width": width, "gate_blocks": n_heads, "conv_kernel": cfg.get_size("conv1d_width")}
        bias = bool(cfg.get("attention_bias"))
        attention = {"kind": "attention", "n_heads": n_heads,
                     "n_kv_heads": cfg.get("num_key_value_heads", None) or n_heads, "head_dim": d_model // n_heads,
                     "window": cfg.get_size("attention_window_size"), "qkv_bias": bias, "out_bias": True}
        hidden = cfg.get_size("intermediate_size")
        model["block"] = {"layout": "prenorm",
                          "norm": {"kind": "rmsnorm", "eps": cfg.get_float("rms_norm_eps"), "offset": 1.0},
                          "mixer": recurrent,
                          "ffn": {"kind": "geglu", "hidden": hidden // 2, "activation": "gelu_tanh", "bias": True}}
        kinds = layer_kinds(cfg, n_layers)
        others = [i for i, kind in enumerate(kinds) if kind == "attention"]
        if len(others) == n_layers:
            model["block"]["mixer"] = attention
        elif others:
            model["layers"] = [{"select": selection(others, n_layers), "mixer": attention}]

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        m, layers = view.model, view.view.layers
        if m.lm_head_bias:
            raise NotExpressible("model.lm_head_bias", f"Hugging Face {view.name} has no LM head bias")
        if m.embedding_multiplier != embedding_scale(m.d_model):
            raise NotExpressible("model.embedding_multiplier", f"{m.embedding_multiplier!r}: Hugging Face {view.name} "
                                 f"scales embeddings by sqrt(d_model) in bfloat16 ({embedding_scale(m.d_model)})")
        if m.logit_softcap is None:
            raise NotExpressible("model.logit_softcap", f"Hugging Face {view.name} always soft-caps its logits")
        view.block_kind("layout", ("prenorm",))
        view.block_kind("norm", ("rmsnorm",))
        if view.uniform("norm", "offset") != 1.0:
            raise NotExpressible("model.block.norm.offset", f"Hugging Face {view.name}'s RMSNorms scale by 1 + weight")
        kinds = view.per_layer("mixer", "kind")
        types = {"rglru": "recurrent", "attention": "attention"}
        for i, kind in enumerate(kinds):
            if kind not in types:
                raise NotExpressible(f"model.layers[{i}].mixer.kind", f"{kind!r} has no equivalent in Hugging Face "
                                     f"{view.name} (whose layers are 'rglru' or 'attention')")
        period = next(p for p in range(1, m.n_layers + 1) if all(kinds[i] == kinds[i % p] for i in range(m.n_layers)))
        config.update(vocab_size=m.vocab_size, hidden_size=m.d_model, num_hidden_layers=m.n_layers,
                      max_position_embeddings=m.context_length, tie_word_embeddings=m.tie_embeddings,
                      logits_soft_cap=m.logit_softcap, rms_norm_eps=view.uniform("norm", "eps"),
                      hidden_activation="gelu_pytorch_tanh", block_types=[types[k] for k in kinds[:period]])
        # Always written: RecurrentGemmaConfig takes a missing partial_rotary_factor as 0.5.
        Rope(partial=True, write_fraction=True).write(view, config)
        recurrent = [layers[i]["mixer"] for i, kind in enumerate(kinds) if kind == "rglru"]
        attention = [i for i, kind in enumerate(kinds) if kind == "attention"]
        heads = None
        if recurrent:
            r = uniform_mixers(recurrent, family=view.name, what="recurrent")
            if r["activation"] != "gelu_tanh" or not r["bias"]:
                raise NotExpressible("model.block.mixer", f"Hugging Face {view.name}'s recurrent blocks use GeLU (tanh) "
                                     "and biases")
            config.update(lru_width=r["width"], conv1d_width=r["conv_kernel"])
            heads = r["gate_blocks"]
        if attention:
            a = uniform_mixers([layers[i]["mixer"] for i in attention], family=view.name, what="attention")
            n_heads, n_kv, head_dim = view.view.attention_sizes(attention[0])
            if heads is not None and n_heads != heads:
                raise NotExpressible("model.block.mixer.gate_blocks", f"Hugging Face {view.name}'s gate blocks are "
                                     f"its attention heads ({n_heads})")
            if head_dim * n_heads != m.d_model or a.get("window") is None or not a["out_bias"] \
                    or a.get("scale") is not None or a.get("logit_softcap") is not None:
                raise NotExpressible("model.layers[*].mixer", f"Hugging Face {view.name}'s attention is windowed, has "
                                     "head_dim d_model / n_heads, the usual scale, no soft cap, and a bias on o_proj")
            heads = n_heads
            config.update(num_key_value_heads=n_kv, attention_window_size=a["window"], attention_bias=a["qkv_bias"])
        else:
            config["attention_window_size"] = DEFAULTS["attention_window_size"]  # read by no layer
        config["num_attention_heads"] = heads
        view.block_kind("ffn", ("geglu",))
        if view.uniform("ffn", "activation") != "gelu_tanh" or not view.uniform("ffn", "bias") \
                or view.uniform("ffn", "hidden") is None:
            raise NotExpressible("model.block.ffn", f"Hugging Face {view.name}'s MLP is GeLU (tanh)-gated with biases "
                                 "and a stated width")
        config["intermediate_size"] = 2 * view.uniform("ffn", "hidden")

    def rules(self) -> list[Rule]:
        attention = [
            Fused([f"{BLOCK}.q_proj.weight", f"{BLOCK}.k_proj.weight", f"{BLOCK}.v_proj.weight"],
                  f"{BLOCK_MIXER}.qkv.weight", sizes=qkv_sizes),
            Fused([f"{BLOCK}.q_proj.bias", f"{BLOCK}.k_proj.bias", f"{BLOCK}.v_proj.bias"],
                  f"{BLOCK_MIXER}.qkv.bias", sizes=qkv_sizes),
            Copy(f"{BLOCK}.o_proj.weight", f"{BLOCK_MIXER}.out.weight"),
            Copy(f"{BLOCK}.o_proj.bias", f"{BLOCK_MIXER}.out.bias"),
        ]
        recurrent = [
            Copy(f"{BLOCK}.linear_x.{p}", f"{BLOCK_MIXER}.x_proj.{p}") for p in ("weight", "bias")
        ] + [Copy(f"{BLOCK}.linear_y.{p}", f"{BLOCK_MIXER}.y_proj.{p}") for p in ("weight", "bias")] + [
            Copy(f"{BLOCK}.linear_out.weight", f"{BLOCK_MIXER}.out.weight"),
            Copy(f"{BLOCK}.linear_out.bias", f"{BLOCK_MIXER}.out.bias"),
            DepthwiseConv(f"{BLOCK}.conv_1d.weight", f"{BLOCK_MIXER}.conv_weight"),
            Copy(f"{BLOCK}.conv_1d.bias", f"{BLOCK_MIXER}.conv_bias"),
            Copy(f"{BLOCK}.rg_lru.recurrent_param", f"{BLOCK_MIXER}.a_param"),
            *(Copy(f"{BLOCK}.rg_lru.{name}", f"{BLOCK_MIXER}.{name}") for name in (
                "input_gate_weight", "input_gate_bias", "recurrent_gate_weight", "recurrent_gate_bias")),
        ]
        return [
            Copy("model.embed_tokens.weight", "embedding.weight"),
            Copy("model.final_norm.weight", "final_norm.weight"),
            Copy("lm_head.weight", "lm_head.weight"),
            Copy(f"{LAYER}.temporal_pre_norm.weight", "blocks.{i}.attention_norm.weight"),
            Copy(f"{LAYER}.channel_pre_norm.weight", "blocks.{i}.ffn_norm.weight"),
            *(AtLayers(rule, where=lambda site: keeps_keys(site.mixer), layers="attention") for rule in attention),
            *(AtLayers(rule, where=lambda site: keeps_state(site.mixer), layers="recurrent") for rule in recurrent),
            Fused([f"{MLP}.gate_proj.weight", f"{MLP}.up_proj.weight"], "blocks.{i}.ffn.gate_up.weight", sizes=halves),
            Fused([f"{MLP}.gate_proj.bias", f"{MLP}.up_proj.bias"], "blocks.{i}.ffn.gate_up.bias", sizes=halves),
            Copy(f"{MLP}.down_proj.weight", "blocks.{i}.ffn.down.weight"),
            Copy(f"{MLP}.down_proj.bias", "blocks.{i}.ffn.down.bias"),
        ]


FAMILY = decoder_family(
    name="RecurrentGemma",
    model_type="recurrent_gemma",
    architecture="RecurrentGemmaForCausalLM",
    defaults=DEFAULTS,
    parts=[RecurrentGemmaModel()],
    # Initialisation only.
    non_math_fields=("w_init_variance_scale", "final_w_init_variance_scale", "head_dim"),
    maps="block_types (repeated) -> rglru (lru_width -> width, num_attention_heads -> gate_blocks, conv1d_width -> "
         "conv_kernel) or attention (GQA, head_dim hidden / heads, attention_window_size -> window, rope on "
         "partial_rotary_factor of each head, attention_bias on q/k/v, o_proj always biased) per layer; pre-norm "
         "(1 + w) RMSNorm; GeLU-gated MLP with biases of width intermediate_size / 2; embeddings x sqrt(hidden_size) "
         "in bfloat16; logits_soft_cap -> logit_softcap",
    caveats=f"context_length is {DEFAULT_CONTEXT} when config.json has no max_position_embeddings (the recurrence "
            "has no limit, the attention a window); recurrent states are kept in the model's dtype",
)
