"""Gated DeltaNet layers among full-attention ones, chosen per layer by ``layer_types`` (Qwen3-Next, Qwen3.5,
Qwen3.5-MoE, OLMo Hybrid): both mixers' config fields, and their weight rules by the kind of layer.

A spec keeps the most common mixer in its block and the other one in a single ``layers:``
override (``{select: "3::4", mixer: {kind: attention, ...}}`` for the published
every-fourth pattern; a list where the pattern is irregular). Weight rules differ by the
kind of layer (a Gated DeltaNet and an attention both have ``qkv`` and ``out``), so every
mixer rule here is wrapped in :class:`AtLayers`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from specformer.errors import UserError

from specformer_hf.config import ConfigReader, activation_from_hf
from specformer_hf.parts.attention import attention_sizes
from specformer_hf.parts.base import ATTN, BLOCK_MIXER, LAYER, FamilyView, Part, layers_of_two_kinds
from specformer_hf.parts.norms import rmsnorm
from specformer_hf.rules import AtLayers, Copy, DepthwiseConv, Fused, OneOf, Rule, Site
from specformer_hf.specview import NotExpressible

LINEAR, FULL = "linear_attention", "full_attention"
#: Our mixer kinds for the two layer types.
KINDS = {LINEAR: "gated_deltanet", FULL: "attention"}
LINEAR_ATTN = f"{LAYER}.linear_attn"


# -- which layers are which --------------------------------------------------------------------------


def full_every(interval: int, n_layers: int) -> list[str]:
    """Every ``interval``-th layer full attention (the 4th, 8th, ...), the others Gated DeltaNet."""
    return [FULL if (i + 1) % interval == 0 else LINEAR for i in range(n_layers)]


def qwen_default_types(cfg: ConfigReader, n_layers: int) -> list[str]:
    """Qwen3-Next / Qwen3.5 without layer_types: every full_attention_interval-th layer (default 4) is full attention."""
    return full_every(cfg.get_size("full_attention_interval", 4), n_layers)


def olmo_default_types(cfg: ConfigReader, n_layers: int) -> list[str]:
    """OLMo Hybrid without layer_types: every 4th layer full attention, the last one if that leaves none."""
    types = full_every(4, n_layers)
    if FULL not in types:
        types[-1] = FULL
    return types


def hybrid_layer_types(cfg: ConfigReader, default: Callable[[ConfigReader, int], list[str]]) -> list[str]:
    n_layers = cfg.get_layers("num_hidden_layers")
    types = cfg.get("layer_types", None)
    if types is None:
        return default(cfg, n_layers)
    if not isinstance(types, list) or len(types) != n_layers:
        raise UserError(f"{cfg.family}: layer_types must list one type for each of the {n_layers} layers, got {types!r}")
    bad = sorted({str(t) for t in types if t not in (LINEAR, FULL)})
    if bad:
        raise UserError(f"{cfg.family}: layer_types {bad} are not supported; supported: {LINEAR}, {FULL}")
    cfg.mark_read("full_attention_interval")  # layer_types decides; transformers reads the interval only without it
    return list(types)


def is_linear(site: Site) -> bool:
    """Whether the site's layer mixes with a recurrent state (a Gated DeltaNet) rather than attention."""
    return getattr(site.mixer, "state_slots", None) is not None


def is_full(site: Site) -> bool:
    return not is_linear(site)


# -- the two mixers, both directions ----------------------------------------------------------------


@dataclass(frozen=True)
class DeltaNetFields:
    """The ``linear_*`` config fields <-> the ``gated_deltanet`` mixer.

    ``olmo``: OLMo Hybrid's extra fields (allow_neg_eigval; the A and dt initialisation ranges)
    and its gated norm's fixed eps 1e-5 (flash-linear-attention's default); the Qwen families'
    gated norm uses rms_norm_eps.
    """

    olmo: bool = False

    def read(self, cfg: ConfigReader) -> dict[str, Any]:
        if self.olmo:  # OlmoHybridConfig derives the sizes it is not given from the attention's
            value_heads = cfg.get("linear_num_value_heads", None) or cfg.get_size("num_attention_heads")
            key_heads = cfg.get("linear_num_key_heads", None) or cfg.get_size("num_attention_heads")
            key_dim = cfg.get("linear_key_head_dim", None) or int(0.75 * cfg.get_size("hidden_size") / key_heads)
            value_dim = cfg.get("linear_value_head_dim", None) or 2 * key_dim
        else:
            value_heads, key_heads = cfg.get_size("linear_num_value_heads"), cfg.get_size("linear_num_key_heads")
            key_dim, value_dim = cfg.get_size("linear_key_head_dim"), cfg.get_size("linear_value_head_dim")
        if value_heads % key_heads:
            raise UserError(f"{cfg.family}: linear_num_key_heads ({key_heads}) must divide linear_num_value_heads "
                            f"({value_heads})")
        mixer: dict[str, Any] = {
            "kind": KINDS[LINEAR], "n_heads": value_heads, "n_key_heads": key_heads, "key_head_dim": key_dim,
            "value_head_dim": value_dim, "conv_kernel": cfg.get_size("linear_conv_kernel_dim"),
        }
        if not self.olmo:
            mixer["norm_eps"] = cfg.get_float("rms_norm_eps")
            return mixer
        mixer.update(
            norm_eps=1e-5, negative_eigenvalues=bool(cfg.get("linear_allow_neg_eigval")),
            a_init_range=(cfg.get_float("linear_a_log_min"), cfg.get_float("linear_a_log_max")),
            dt_init_range=(cfg.get_float("linear_dt_min"), cfg.get_float("linear_dt_max")),
            dt_init_floor=cfg.get_float("linear_dt_init_floor"),
        )
        return mixer

    def write(self, mixer: dict[str, Any], config: dict[str, Any], family: str, d_model: int) -> None:
        if mixer.get("conv_bias"):
            raise NotExpressible("model.block.mixer.conv_bias", f"Hugging Face {family}'s convolution has no bias")
        key_dim = mixer["key_head_dim"] or d_model // mixer["n_heads"]  # the mixer's own defaults, written out
        config.update(
            linear_num_value_heads=mixer["n_heads"], linear_num_key_heads=mixer["n_key_heads"] or mixer["n_heads"],
            linear_key_head_dim=key_dim, linear_value_head_dim=mixer["value_head_dim"] or key_dim,
            linear_conv_kernel_dim=mixer["conv_kernel"],
        )
        if not self.olmo:
            return
        if mixer["norm_eps"] != 1e-5:
            raise NotExpressible("model.block.mixer.norm_eps", f"{mixer['norm_eps']}: Hugging Face {family}'s "
                                 "gated norm always uses 1e-5")
        dt_range = mixer["dt_init_range"] or (0.001, 0.1)  # dt_bias starting at 1 has no OLMo equivalent: init only
        config.update(
            linear_allow_neg_eigval=mixer["negative_eigenvalues"], linear_a_log_min=mixer["a_init_range"][0],
            linear_a_log_max=mixer["a_init_range"][1], linear_dt_min=dt_range[0], linear_dt_max=dt_range[1],
            linear_dt_init_floor=mixer["dt_init_floor"],
        )


@dataclass(frozen=True)
class AttentionFields:
    """num_attention_heads, num_key_value_heads, head_dim, attention_bias <-> the full-attention layers' ``attention``.

    ``gated``: Qwen's attention (an output gate, (1 + w) RMSNorm on each query and key head);
    otherwise OLMo's (RMSNorm over all query heads at once, and over all key heads).
    """

    gated: bool = True

    def read(self, cfg: ConfigReader) -> dict[str, Any]:
        attention = attention_sizes(cfg)
        bias = bool(cfg.get("attention_bias"))
        attention.update(qkv_bias=bias, out_bias=bias)
        if self.gated:
            attention.update(output_gate=True, qk_norm=rmsnorm(cfg, offset=1.0), qk_norm_scope="head")
        else:
            attention.update(qk_norm=rmsnorm(cfg), qk_norm_scope="all")
        return attention

    def write(self, attention: dict[str, Any], config: dict[str, Any], family: str, d_model: int) -> None:
        if attention["output_gate"] != self.gated:
            raise NotExpressible("model.layers[*].mixer.output_gate",
                                 f"Hugging Face {family}'s attention {'always' if self.gated else 'never'} gates its output")
        n_heads = attention["n_heads"]
        config.update(num_attention_heads=n_heads, num_key_value_heads=attention.get("n_kv_heads") or n_heads,
                      head_dim=attention.get("head_dim") or d_model // n_heads, attention_bias=attention["qkv_bias"])


@dataclass(frozen=True)
class HybridMixers(Part):
    """layer_types and both mixers' fields <-> the block's mixer plus one ``layers:`` override for the other type.

    ``layouts``: each type's block layout where they differ (OLMo Hybrid: prenorm Gated
    DeltaNet layers, postnorm_inside attention layers); None: the block's one layout.
    The Gated DeltaNet's convolution uses hidden_act, which must therefore be SiLU.
    ``both_types``: the family needs at least one layer of each type (OLMo Hybrid).
    """

    linear: DeltaNetFields
    full: AttentionFields
    default_types: Callable[[ConfigReader, int], list[str]]
    layouts: tuple[str, str] | None = None
    both_types: bool = False

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        types = hybrid_layer_types(cfg, self.default_types)
        if LINEAR in types and activation_from_hf(cfg, "hidden_act") != "silu":
            raise UserError(f"{cfg.family}: hidden_act {cfg.get('hidden_act')!r} is not supported with "
                            "linear_attention layers: their convolution is followed by SiLU here")
        mixers = {LINEAR: self.linear.read(cfg), FULL: self.full.read(cfg)}
        layouts = dict(zip((LINEAR, FULL), self.layouts)) if self.layouts else None
        layers_of_two_kinds(model, types, {t: {"mixer": mixers[t], **({"layout": layouts[t]} if layouts else {})}
                                           for t in (LINEAR, FULL)})

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        mixers = view.per_layer("mixer")
        by_kind = {kind: layer_type for layer_type, kind in KINDS.items()}
        for i, mixer in enumerate(mixers):
            if mixer["kind"] not in by_kind:
                raise NotExpressible(f"model.layers[{i}].mixer.kind", f"{mixer['kind']!r} has no equivalent in "
                                     f"Hugging Face {view.name} (which uses 'gated_deltanet' or 'attention')")
        types = [by_kind[m["kind"]] for m in mixers]
        first: dict[str, int] = {}
        for i, (layer_type, mixer) in enumerate(zip(types, mixers)):
            j = first.setdefault(layer_type, i)
            if mixer != mixers[j]:
                raise NotExpressible(f"model.layers[{i}].mixer", f"differs from layer {j}'s; Hugging Face "
                                     f"{view.name} has one setting for all {layer_type} layers")
        if self.both_types and len(first) < 2:
            raise NotExpressible("model.layers[*].mixer.kind", f"Hugging Face {view.name} needs at least one "
                                 "gated_deltanet layer and one attention layer")
        if LINEAR in first:
            self.linear.write(mixers[first[LINEAR]], config, view.name, view.model.d_model)
            if config.get("hidden_act", "silu") != "silu":
                raise NotExpressible("model.block.ffn.activation", f"{config['hidden_act']!r}: Hugging Face "
                                     f"{view.name} applies hidden_act after the Gated DeltaNet's convolution too, "
                                     "which is SiLU")
        if FULL in first:
            self.full.write(mixers[first[FULL]], config, view.name, view.model.d_model)
        config["layer_types"] = types


# -- weights ----------------------------------------------------------------------------------------------


def at_linear(rules: Sequence[Rule]) -> list[Rule]:
    return [AtLayers(rule, where=is_linear, layers="Gated DeltaNet") for rule in rules]


def at_full(rules: Sequence[Rule]) -> list[Rule]:
    return [AtLayers(rule, where=is_full, layers="attention") for rule in rules]


class GatedQuery(Rule):
    """Qwen's gated attention: ``q_proj`` holds, head by head, the query's channels then the gate's ``[q_h; g_h]``.

    Ours: the queries are the first rows of ``qkv`` (then k_proj's and v_proj's), the gate is
    ``gate``. Weights and biases alike (a bias has no input dimension).
    """

    def __init__(self, hf: Sequence[str], ours: Sequence[str]) -> None:
        self.hf, self.ours = tuple(hf), tuple(ours)

    def to_ours(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        q_proj, k_proj, v_proj = tensors
        heads, head_dim = site.mixer.n_heads, site.mixer.head_dim
        paired = q_proj.reshape(heads, 2, head_dim, *q_proj.shape[1:])  # (H, [query, gate], hd, ...)
        query, gate = (paired[:, j].reshape(heads * head_dim, *q_proj.shape[1:]) for j in (0, 1))
        return [torch.cat([query, k_proj, v_proj]).contiguous(), gate.contiguous()]

    def to_hf(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        qkv, gate = tensors
        a = site.mixer
        query, k_proj, v_proj = qkv.split([a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim,
                                           a.n_kv_heads * a.head_dim])
        rest = qkv.shape[1:]
        paired = torch.stack([query.reshape(a.n_heads, a.head_dim, *rest), gate.reshape(a.n_heads, a.head_dim, *rest)],
                             dim=1)  # (H, 2, hd, ...)
        return [paired.reshape(2 * a.n_heads * a.head_dim, *rest).contiguous(), k_proj.contiguous(), v_proj.contiguous()]


def _delta_sizes(site: Site) -> tuple[int, int, int, int, int]:
    """(key heads, value heads per key head, key head dim, value head dim, value heads) of a Gated DeltaNet."""
    mixer = site.mixer
    return mixer.n_kv_heads, mixer.n_heads // mixer.n_kv_heads, mixer.key_head_dim, mixer.head_dim, mixer.n_heads


class GroupedQKVZ(Rule):
    """Qwen3-Next's ``in_proj_qkvz``: per key head g, ``[q_g (dk); k_g (dk); v_g (r dv); z_g (r dv)]`` with r value
    heads per key head. Ours: ``qkv`` ``[q (all heads); k; v]`` and ``z``; value head ``g r + j`` is the j-th of group g
    in both."""

    def __init__(self, hf: str, ours: Sequence[str]) -> None:
        self.hf, self.ours = (hf,), tuple(ours)

    def to_ours(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        key_heads, r, dk, dv, _ = _delta_sizes(site)
        t = tensors[0]
        grouped = t.reshape(key_heads, 2 * dk + 2 * r * dv, t.shape[-1])  # (Hk, 2 dk + 2 r dv, D)
        q, k, v, z = (part.reshape(-1, t.shape[-1]) for part in grouped.split([dk, dk, r * dv, r * dv], dim=1))
        return [torch.cat([q, k, v]).contiguous(), z.contiguous()]

    def to_hf(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        key_heads, r, dk, dv, value_heads = _delta_sizes(site)
        qkv, z = tensors
        d = qkv.shape[-1]
        q, k, v = qkv.split([key_heads * dk, key_heads * dk, value_heads * dv])
        parts = [q.reshape(key_heads, dk, d), k.reshape(key_heads, dk, d), v.reshape(key_heads, r * dv, d),
                 z.reshape(key_heads, r * dv, d)]
        return [torch.cat(parts, dim=1).reshape(-1, d).contiguous()]  # (Hk (2 dk + 2 r dv), D)


class GroupedBA(Rule):
    """Qwen3-Next's ``in_proj_ba``: per key head g, ``[b_g (r); a_g (r)]``. Ours: ``b`` and ``a``, one row per value head."""

    def __init__(self, hf: str, ours: Sequence[str]) -> None:
        self.hf, self.ours = (hf,), tuple(ours)

    def to_ours(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        key_heads, r, _, _, _ = _delta_sizes(site)
        t = tensors[0]
        b, a = t.reshape(key_heads, 2 * r, t.shape[-1]).split([r, r], dim=1)  # (Hk, r, D) each
        return [b.reshape(-1, t.shape[-1]).contiguous(), a.reshape(-1, t.shape[-1]).contiguous()]

    def to_hf(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        key_heads, r, _, _, _ = _delta_sizes(site)
        b, a = tensors
        d = b.shape[-1]
        return [torch.cat([b.reshape(key_heads, r, d), a.reshape(key_heads, r, d)], dim=1).reshape(-1, d).contiguous()]


def _qkv_of_delta(site: Site) -> tuple[int, int, int]:
    key_heads, _, dk, dv, value_heads = _delta_sizes(site)
    return key_heads * dk, key_heads * dk, value_heads * dv




def delta_state_rules(prefix: str = LINEAR_ATTN, *, norm: str = "norm", out: str = "out_proj") -> list[Rule]:
    """A_log, dt_bias, the gated norm and the output projection, as every family names them but OLMo's last two."""
    return [Copy(f"{prefix}.A_log", f"{BLOCK_MIXER}.A_log"), Copy(f"{prefix}.dt_bias", f"{BLOCK_MIXER}.dt_bias"),
            Copy(f"{prefix}.{norm}.weight", f"{BLOCK_MIXER}.norm.weight"), Copy(f"{prefix}.{out}.weight", f"{BLOCK_MIXER}.out.weight")]


def qwen3_next_delta_rules() -> list[Rule]:
    return at_linear([
        GroupedQKVZ(f"{LINEAR_ATTN}.in_proj_qkvz.weight", (f"{BLOCK_MIXER}.qkv.weight", f"{BLOCK_MIXER}.z.weight")),
        GroupedBA(f"{LINEAR_ATTN}.in_proj_ba.weight", (f"{BLOCK_MIXER}.b.weight", f"{BLOCK_MIXER}.a.weight")),
        DepthwiseConv(f"{LINEAR_ATTN}.conv1d.weight", f"{BLOCK_MIXER}.conv_weight"),
        *delta_state_rules(),
    ])


def qwen3_5_delta_rules() -> list[Rule]:
    return at_linear([
        Copy(f"{LINEAR_ATTN}.in_proj_qkv.weight", f"{BLOCK_MIXER}.qkv.weight"),
        Copy(f"{LINEAR_ATTN}.in_proj_z.weight", f"{BLOCK_MIXER}.z.weight"),
        Copy(f"{LINEAR_ATTN}.in_proj_b.weight", f"{BLOCK_MIXER}.b.weight"),
        Copy(f"{LINEAR_ATTN}.in_proj_a.weight", f"{BLOCK_MIXER}.a.weight"),
        DepthwiseConv(f"{LINEAR_ATTN}.conv1d.weight", f"{BLOCK_MIXER}.conv_weight"),
        *delta_state_rules(),
    ])


def olmo_delta_rules() -> list[Rule]:
    """OLMo Hybrid's separate projections; the convolution per q, k and v as its checkpoints (and transformers' saves)
    store it, or fused as transformers holds it in memory."""
    convs = [f"{LINEAR_ATTN}.{x}_conv1d.weight" for x in "qkv"]
    return at_linear([
        Fused([f"{LINEAR_ATTN}.{x}_proj.weight" for x in "qkv"], f"{BLOCK_MIXER}.qkv.weight", sizes=_qkv_of_delta),
        Copy(f"{LINEAR_ATTN}.g_proj.weight", f"{BLOCK_MIXER}.z.weight"),
        Copy(f"{LINEAR_ATTN}.b_proj.weight", f"{BLOCK_MIXER}.b.weight"),
        Copy(f"{LINEAR_ATTN}.a_proj.weight", f"{BLOCK_MIXER}.a.weight"),
        OneOf(DepthwiseConv(convs, f"{BLOCK_MIXER}.conv_weight", sizes=_qkv_of_delta), DepthwiseConv(f"{LINEAR_ATTN}.conv1d.weight", f"{BLOCK_MIXER}.conv_weight")),
        *delta_state_rules(norm="o_norm", out="o_proj"),
    ])


def gated_attention_rules() -> list[Rule]:
    """Qwen's full-attention layers: q_proj (queries and gates, head by head), k_proj, v_proj, o_proj, q/k norms."""
    return at_full([
        GatedQuery([f"{ATTN}.{x}_proj.weight" for x in "qkv"], (f"{BLOCK_MIXER}.qkv.weight", f"{BLOCK_MIXER}.gate.weight")),
        GatedQuery([f"{ATTN}.{x}_proj.bias" for x in "qkv"], (f"{BLOCK_MIXER}.qkv.bias", f"{BLOCK_MIXER}.gate.bias")),
        *plain_attention_rules(),
    ])


def plain_attention_rules() -> list[Rule]:
    return [Copy(f"{ATTN}.o_proj.weight", f"{BLOCK_MIXER}.out.weight"), Copy(f"{ATTN}.o_proj.bias", f"{BLOCK_MIXER}.out.bias"),
            Copy(f"{ATTN}.q_norm.weight", f"{BLOCK_MIXER}.q_norm.weight"), Copy(f"{ATTN}.k_norm.weight", f"{BLOCK_MIXER}.k_norm.weight")]


def _qkv(site: Site) -> tuple[int, int, int]:
    a = site.mixer
    return a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim, a.n_kv_heads * a.head_dim


def olmo_attention_rules() -> list[Rule]:
    return at_full([
        Fused([f"{ATTN}.{x}_proj.weight" for x in "qkv"], f"{BLOCK_MIXER}.qkv.weight", sizes=_qkv),
        Fused([f"{ATTN}.{x}_proj.bias" for x in "qkv"], f"{BLOCK_MIXER}.qkv.bias", sizes=_qkv),
        *plain_attention_rules(),
    ])


def olmo_norm_rules() -> list[Rule]:
    """OLMo Hybrid's norms by the kind of layer, read under either of the names in use, written as transformers saves them.

    Gated DeltaNet layers are prenorm: attention_layer_norm (in memory input_layernorm) before the mixer,
    feedforward_layer_norm (post_attention_layernorm) before the MLP. Attention layers norm each
    sublayer's output: feedforward_layer_norm (post_attention_layernorm) after attention,
    post_feedforward_layernorm after the MLP. (transformers renames post_attention_layernorm to
    feedforward_layer_norm in every layer when it saves.)
    """
    ours = "blocks.{i}"

    def either(saved: str, in_memory: str, target: str) -> Rule:
        return OneOf(Copy(f"{LAYER}.{saved}.weight", f"{ours}.{target}.weight"),
                     Copy(f"{LAYER}.{in_memory}.weight", f"{ours}.{target}.weight"))

    return [
        *at_linear([either("attention_layer_norm", "input_layernorm", "attention_norm"),
                    either("feedforward_layer_norm", "post_attention_layernorm", "ffn_norm")]),
        *at_full([either("feedforward_layer_norm", "post_attention_layernorm", "attention_norm"),
                  Copy(f"{LAYER}.post_feedforward_layernorm.weight", f"{ours}.ffn_norm.weight")]),
    ]


__all__ = [
    "AttentionFields", "DeltaNetFields", "FULL", "GatedQuery", "GroupedBA", "GroupedQKVZ",
    "HybridMixers", "LINEAR", "at_full", "at_linear", "gated_attention_rules",
    "hybrid_layer_types", "olmo_attention_rules", "olmo_default_types", "olmo_delta_rules", "olmo_norm_rules",
    "qwen3_5_delta_rules", "qwen3_next_delta_rules", "qwen_default_types",
]
