"""LFM3 (``model_type: lfm3``, Liquid AI): LFM2's gated short convolutions between sliding-window and global
attention layers, with sandwich norms and a sigmoid gate per attention head.

Each layer is a ``conv`` layer (the ``short_conv`` mixer, as LFM2's), a ``sliding_attention``
or a ``full_attention`` one (Qwen3's attention: grouped heads of head_dim, an RMSNorm per head
on queries and keys, then the rope of the layer type: by default the plain rope on the sliding
layers and the proportional one on the global layers). ``use_attention_gate`` scales each
head's output by ``sigmoid(x g_proj)`` (``gate_proj`` in checkpoints), one logit per head (``output_gate_scope: head``);
``use_sandwich_norm`` adds LFM3's ``post_operator_norm`` and ``post_ffn_norm`` (layout
sandwich). The feed-forward is SwiGLU of width ``intermediate_size`` (``w1``, ``w3``, ``w2``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError

from specformer_hf.config import ConfigReader
from specformer_hf.families.gemma4 import layer_type_rope, layer_type_rope_parameters
from specformer_hf.families.lfm2 import Lfm2FFN, Lfm2Sizes, Mixers as Lfm2Mixers, OnMixer
from specformer_hf.parts.attention import Attention, QKNorm, attention_sizes
from specformer_hf.parts.base import ATTN, BLOCK_MIXER, LAYER, FamilyView, Part, selection
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.norms import RMSNorm, rmsnorm
from specformer_hf.rules import Copy, Rule
from specformer_hf.specview import NotExpressible
from specformer_layers import default_gated_hidden

CONV, SLIDING, FULL = "conv", "sliding_attention", "full_attention"

#: transformers' rope parameters when an LFM3 config has none (Lfm3Config's __post_init__).
DEFAULT_ROPE = {SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
                FULL: {"rope_type": "proportional", "rope_theta": 1_000_000.0, "partial_rotary_factor": 0.5}}

#: transformers' Lfm3Config defaults (LiquidAI/LFM3-1.7B's sizes, as its docstring says).
DEFAULTS = {
    "vocab_size": 128_000, "hidden_size": 2048, "intermediate_size": 7680, "num_hidden_layers": 24,
    "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 128, "max_position_embeddings": 128_000,
    "norm_eps": 1e-5, "tie_word_embeddings": True, "rope_parameters": DEFAULT_ROPE, "conv_bias": False, "conv_L_cache": 7,
    "layer_types": None, "sliding_window": 256, "use_sandwich_norm": True, "use_attention_gate": True,
    "attention_bias": False,
}


def default_layer_types(n_layers: int) -> list[str]:
    """Lfm3Config's pattern: global attention at 2, 6, 10, ..., sliding at 4, 8, ..., short convolutions elsewhere."""
    return [FULL if i % 4 == 2 else SLIDING if i % 4 == 0 and i > 0 else CONV for i in range(n_layers)]


def _layer_types(cfg: ConfigReader, n_layers: int) -> list[str]:
    types = cfg.get("layer_types") or default_layer_types(n_layers)
    if not isinstance(types, list) or len(types) != n_layers:
        raise UserError(f"{cfg.family}: layer_types must list one type for each of the {n_layers} layers, got {types!r}")
    bad = sorted({repr(t) for t in types if t not in (CONV, SLIDING, FULL)})
    if bad:
        raise UserError(f"{cfg.family}: layer_types {', '.join(bad)} are not supported; supported: {CONV}, {SLIDING}, "
                        f"{FULL}")
    return list(types)


def _change(part: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """The override turning ``base`` into ``part``: the whole part where the kind changes, else its changed keys."""
    if part.get("kind") != base.get("kind"):
        return part
    return {k: part.get(k) for k in {*part, *base} if part.get(k) != base.get(k)}


@dataclass(frozen=True)
class Lfm3Layers(Part):
    """layer_types, sliding_window, the heads, attention_bias, use_attention_gate, conv_L_cache, conv_bias and
    rope_parameters per attention layer type <-> each layer's mixer (short_conv or attention) and rope."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        n_layers = cfg.get_layers("num_hidden_layers")
        types = _layer_types(cfg, n_layers)
        conv_bias = bool(cfg.require("conv_bias", (False, True), why="it switches the short convolutions' biases"))
        conv = {"kind": "short_conv", "kernel": cfg.get_int("conv_L_cache"), "bias": conv_bias, "conv_bias": conv_bias}
        bias = bool(cfg.require("attention_bias", (False, True), why="it switches the attention's biases"))
        attention = {**attention_sizes(cfg), "qk_norm": rmsnorm(cfg, eps_key="norm_eps"), "qk_norm_scope": "head",
                     "qkv_bias": bias, "out_bias": bias}
        if cfg.require("use_attention_gate", (False, True), why="it switches the per-head output gate"):
            attention.update(output_gate=True, output_gate_scope="head")
        window = cfg.get_size("sliding_window") if SLIDING in types else cfg.get("sliding_window")
        ropes = {t: layer_type_rope(cfg, t, DEFAULT_ROPE) for t in (SLIDING, FULL)}
        cfg.mark_read("rope_parameters")
        mixers = {CONV: conv, SLIDING: {**attention, "window": window}, FULL: {**attention, "window": None}}
        # A convolution reads no positions: it takes the rope of the commoner attention type, so needs no override.
        attending = [t for t in types if t != CONV]
        base_rope = ropes[max((SLIDING, FULL), key=attending.count)]
        layers = [{"mixer": mixers[t], "positional": ropes.get(t, base_rope) if t != CONV else base_rope}
                  for t in types]
        base_type = max(dict.fromkeys(types), key=types.count)
        base = {"mixer": mixers[base_type], "positional": base_rope}
        model["positional"] = base_rope
        model.setdefault("block", {})["mixer"] = base["mixer"]
        keys = [json.dumps({name: _change(layer[name], base[name]) for name in layer}, sort_keys=True) for layer in layers]
        for key in dict.fromkeys(keys):
            change = {name: part for name, part in json.loads(key).items() if part}
            if change:
                indices = [i for i, k in enumerate(keys) if k == key]
                model.setdefault("layers", []).append({"select": selection(indices, n_layers), **change})

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        mixers = view.per_layer("mixer")
        positionals = [p or view.positional for p in view.per_layer("positional")]
        types = []
        for i, mixer in enumerate(mixers):
            if mixer["kind"] not in ("short_conv", "attention"):
                raise NotExpressible(f"model.layers[{i}].mixer.kind", f"{mixer['kind']!r} has no equivalent in Hugging "
                                     f"Face {view.name} (which has 'short_conv' and 'attention' layers)")
            types.append(CONV if mixer["kind"] == "short_conv" else SLIDING if mixer.get("window") else FULL)
        convs = [m for m in mixers if m["kind"] == "short_conv"]
        attentions = [(i, {k: v for k, v in m.items() if k != "window"}) for i, m in enumerate(mixers)
                      if m["kind"] == "attention"]
        if any(c != convs[0] for c in convs[1:]):
            raise NotExpressible("model.layers[*].mixer", f"the short_conv layers differ; Hugging Face {view.name} "
                                 "has one conv_L_cache and conv_bias for all")
        if convs and convs[0]["bias"] != convs[0]["conv_bias"]:
            raise NotExpressible("model.block.mixer.conv_bias", f"Hugging Face {view.name}'s conv_bias switches the "
                                 "projections' biases and the convolution's together (bias and conv_bias must be equal)")
        if any(m != attentions[0][1] for _, m in attentions[1:]):
            raise NotExpressible("model.layers[*].mixer", f"the attention layers differ (beyond their windows); Hugging "
                                 f"Face {view.name} has one attention setting for all")
        windows = {m["window"] for m in mixers if m.get("window")}
        if len(windows) > 1:
            raise NotExpressible("model.layers[*].mixer.window", f"several window sizes {sorted(windows)}; Hugging "
                                 f"Face {view.name} has one sliding_window")
        config.update(layer_types=types, sliding_window=windows.pop() if windows else DEFAULTS["sliding_window"])
        if convs:
            config.update(conv_L_cache=convs[0]["kernel"], conv_bias=convs[0]["conv_bias"])
        rope_parameters = dict(DEFAULT_ROPE)
        if attentions:
            index, attention = attentions[0]
            self._check_attention(view, attention)
            n_heads, n_kv, head_dim = view.view.attention_sizes(index)
            config.update(num_attention_heads=n_heads, num_key_value_heads=n_kv, head_dim=head_dim,
                          attention_bias=attention["qkv_bias"], use_attention_gate=attention["output_gate"])
            for layer_type in (SLIDING, FULL):
                mine = [(i, p) for i, (t, p) in enumerate(zip(types, positionals)) if t == layer_type]
                for i, scheme in mine[1:]:
                    if scheme != mine[0][1]:
                        raise NotExpressible(f"model.layers[{i}].positional", f"differs from layer {mine[0][0]}'s; "
                                             f"Hugging Face {view.name} has one rope for all {layer_type} layers")
                if mine:
                    rope_parameters[layer_type] = layer_type_rope_parameters(mine[0][1], view.name)
        else:
            # No attention layer: the heads size only transformers' unused rotary table; any divisor does.
            config.update(num_attention_heads=1, num_key_value_heads=1, head_dim=view.model.d_model)
        config["rope_parameters"] = rope_parameters

    @staticmethod
    def _check_attention(view: FamilyView, attention: dict[str, Any]) -> None:
        name = view.name
        if attention.get("qk_norm") is None or attention.get("qk_norm_scope") != "head":
            raise NotExpressible("model.block.mixer.qk_norm", f"Hugging Face {name} normalises each query and key head "
                                 "(qk_norm: rmsnorm, qk_norm_scope: head)")
        if attention["qkv_bias"] != attention["out_bias"]:
            raise NotExpressible("model.block.mixer.out_bias", f"Hugging Face {name}'s attention_bias switches the "
                                 "q/k/v and output biases together (qkv_bias and out_bias must be equal)")
        if attention["output_gate"] and attention.get("output_gate_scope") != "head":
            raise NotExpressible("model.block.mixer.output_gate_scope", f"Hugging Face {name} gates whole heads "
                                 "(output_gate_scope: head)")
        for key in ("logit_softcap", "scale", "sinks", "chunk", "clip_qkv", "v_norm", "kv_from", "k_eq_v",
                    "temperature_tuning"):
            if attention.get(key):
                raise NotExpressible(f"model.block.mixer.{key}", f"has no equivalent in Hugging Face {name}")

    def rules(self) -> list[Rule]:
        attention = [*Attention().rules(), *QKNorm().rules(),
                     # transformers' g_proj, saved as gate_proj (its conversion mapping renames it both ways)
                     Copy(f"{ATTN}.gate_proj.weight", f"{BLOCK_MIXER}.gate.weight")]
        convs = [r for r in Lfm2Mixers().rules() if isinstance(r, OnMixer) and r.mixer == "short_conv"]
        return [OnMixer(r, mixer="attention") for r in attention] + convs


@dataclass(frozen=True)
class SandwichSwitch(Part):
    """use_sandwich_norm <-> layout sandwich (LFM3's post_operator_norm, post_ffn_norm) or prenorm."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        on = cfg.require("use_sandwich_norm", (False, True), why="it switches the norms after the mixer and the MLP")
        model.setdefault("block", {})["layout"] = "sandwich" if on else "prenorm"

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        config["use_sandwich_norm"] = view.block_kind("layout", ("sandwich", "prenorm")) == "sandwich"

    def rules(self) -> list[Rule]:
        names = (("attention_norm", "operator_norm"), ("attention_post_norm", "post_operator_norm"),
                 ("ffn_norm", "ffn_norm"), ("ffn_post_norm", "post_ffn_norm"))
        return [Copy(f"{LAYER}.{hf}.weight", f"blocks.{{i}}.{ours}.weight") for ours, hf in names]


@dataclass(frozen=True)
class Lfm3FFN(Lfm2FFN):
    """LFM2's SwiGLU (``w1``, ``w3``, ``w2``) of width intermediate_size as it is (LFM3 derives no width)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        model.setdefault("block", {})["ffn"] = {"kind": "swiglu", "hidden": cfg.get_size("intermediate_size"),
                                                "activation": "silu"}

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        view.block_kind("ffn", ("swiglu",))
        if view.uniform("ffn", "activation") != "silu" or view.uniform("ffn", "bias"):
            raise NotExpressible("model.block.ffn", f"Hugging Face {view.name}'s feed-forward is SwiGLU with silu and no biases")
        config["intermediate_size"] = view.uniform("ffn", "hidden") or default_gated_hidden(view.model.d_model)


FAMILY = decoder_family(
    name="LFM3",
    model_type="lfm3",
    architecture="Lfm3ForCausalLM",
    defaults=DEFAULTS,
    parts=[Lfm2Sizes(), SandwichSwitch(), RMSNorm(eps_key="norm_eps"), Lfm3Layers(), Lfm3FFN()],
    maps="layer_types as short_conv layers (conv_L_cache as kernel, conv_bias) and sliding or global attention "
         "layers (GQA with head_dim, RMSNorm per head on q and k, attention_bias, use_attention_gate -> output_gate "
         "per head) by layers: overrides; rope_parameters per attention layer type (default or proportional); "
         "use_sandwich_norm -> layout sandwich (else prenorm); SwiGLU of intermediate_size",
    caveats="conv_bias switches the short convolutions' projection and convolution biases together; "
            "attention_bias the q/k/v and output biases together; the head gate has no bias",
)
