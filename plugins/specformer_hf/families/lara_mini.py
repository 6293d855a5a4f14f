"""Lara-Mini (``model_type: lara_mini``, translated/Lara-4-Mini-Base): Qwen3.5's Gated DeltaNet layers among sliding-window
attention layers with rope and full attention layers without positions, over softmax-routed experts with an ungated
shared expert in every layer.

``layer_types`` (default: the pattern linear, sliding, linear, full, sliding repeated) picks each
layer's mixer: ``linear_attention`` a ``gated_deltanet`` (the ``linear_*`` fields, its gated norm
with a plain weight), ``sliding_attention`` Qwen3's attention (an RMSNorm per query and key head)
over the last ``sliding_window`` keys with rope, ``full_attention`` the same attention over every
key and no positions (transformers hands those layers no rope). Pre-norm RMSNorms with a plain
weight. Checkpoints fuse the Gated DeltaNet's input projections into one ``in_proj`` (rows
``[q | k | v | z | b | a]``) and name its gated norm ``out_norm``; transformers splits and renames
them on load and back on save. Both spellings are read; export writes the checkpoints'. The experts stay fused
(``gate_up_proj``, ``down_proj``) in the checkpoints; per-expert files are read too.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor

from specformer.errors import UserError

from specformer_hf.config import ConfigReader, activation_from_hf
from specformer_hf.parts.attention import attention_sizes
from specformer_hf.parts.base import BLOCK_MIXER, FamilyView, Part, selection
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.deltanet import (LINEAR_ATTN, DeltaNetFields, at_linear, delta_state_rules,
                                          olmo_attention_rules)
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.feedforward import MixtureOfExperts
from specformer_hf.parts.norms import Layout, RMSNorm, rmsnorm
from specformer_hf.parts.positions import Rope
from specformer_hf.rules import Copy, DepthwiseConv, OneOf, Rule, Site
from specformer_hf.specview import NotExpressible

#: transformers' LaraMiniConfig defaults (its docstring names translated/Lara-4-Mini-Base).
DEFAULTS = {
    "vocab_size": 151936, "hidden_size": 1024, "num_hidden_layers": 34, "num_attention_heads": 16,
    "num_key_value_heads": 4, "hidden_act": "silu", "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True, "attention_bias": False, "head_dim": 128, "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 8, "linear_num_value_heads": 16,
    "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "num_experts_per_tok": 4,
    "num_experts": 128, "norm_topk_prob": True, "router_aux_loss_coef": 0.001, "layer_types": None,
    "sliding_window": 512, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}

LINEAR, SLIDING, FULL = "linear_attention", "sliding_attention", "full_attention"
#: LaraMiniConfig's layer_types when a config has none: this pattern, repeated over the layers.
DEFAULT_PATTERN = (LINEAR, SLIDING, LINEAR, FULL, SLIDING)


def _layer_types(cfg: ConfigReader) -> list[str]:
    n_layers = cfg.get_layers("num_hidden_layers")
    types = cfg.get("layer_types", None)
    if types is None:
        return [DEFAULT_PATTERN[i % len(DEFAULT_PATTERN)] for i in range(n_layers)]
    if not isinstance(types, list) or len(types) != n_layers:
        raise UserError(f"{cfg.family}: layer_types must list one type for each of the {n_layers} layers, got {types!r}")
    bad = sorted({str(t) for t in types if t not in (LINEAR, SLIDING, FULL)})
    if bad:
        raise UserError(f"{cfg.family}: layer_types {bad} are not supported; supported: {LINEAR}, {SLIDING}, {FULL}")
    return list(types)


@dataclass(frozen=True)
class LaraMixers(Part):
    """layer_types, the linear_* fields, the attention's fields and sliding_window <-> each layer's mixer (the commonest
    in the block, the others ``layers:`` overrides) and ``positional: none`` on the full-attention layers."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        types = _layer_types(cfg)
        if LINEAR in types and activation_from_hf(cfg, "hidden_act") != "silu":
            raise UserError(f"{cfg.family}: hidden_act {cfg.get('hidden_act')!r} is not supported with "
                            "linear_attention layers: their convolution is followed by SiLU here")
        bias = bool(cfg.get("attention_bias"))
        attention = {**attention_sizes(cfg), "qkv_bias": bias, "out_bias": bias, "qk_norm": rmsnorm(cfg),
                     "qk_norm_scope": "head"}
        window = cfg.get_size("sliding_window") if SLIDING in types else cfg.get("sliding_window")
        mixers = {LINEAR: DeltaNetFields().read(cfg), SLIDING: {**attention, "window": window},
                  FULL: {**attention, "window": None}}  # an override merges into the block's mixer: say no window
        base = Counter(types).most_common(1)[0][0]
        model.setdefault("block", {})["mixer"] = mixers[base]
        for kind in (LINEAR, SLIDING, FULL):
            chosen = [i for i, t in enumerate(types) if t == kind]
            override: dict[str, Any] = {}
            if chosen and kind != base:
                override["mixer"] = mixers[kind]
            if chosen and kind == FULL:
                override["positional"] = "none"  # transformers passes these layers no rotary embeddings
            if override:
                model.setdefault("layers", []).append({"select": selection(chosen, len(types)), **override})

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        mixers, schemes = view.per_layer("mixer"), view.per_layer("positional")
        types: list[str] = []
        for i, mixer in enumerate(mixers):
            if mixer["kind"] not in ("gated_deltanet", "attention"):
                raise NotExpressible(f"model.layers[{i}].mixer.kind", f"{mixer['kind']!r} has no equivalent in Hugging "
                                     f"Face {view.name} (which uses 'gated_deltanet' or 'attention')")
            types.append(LINEAR if mixer["kind"] == "gated_deltanet" else SLIDING if mixer.get("window") else FULL)
        plain = lambda m: {k: v for k, v in m.items() if k != "window"}  # noqa: E731
        first: dict[str, int] = {}
        for i, (kind, mixer) in enumerate(zip(types, mixers)):
            j = first.setdefault(kind if kind == LINEAR else "attention", i)
            if (mixer if kind == LINEAR else plain(mixer)) != (mixers[j] if kind == LINEAR else plain(mixers[j])):
                raise NotExpressible(f"model.layers[{i}].mixer", f"differs from layer {j}'s; Hugging Face {view.name} has "
                                     "one Gated DeltaNet setting and one attention setting (sliding layers add a window)")
            wanted = "none" if kind == FULL else "rope" if kind == SLIDING else None
            scheme = schemes[i] or view.positional
            if wanted and (scheme["kind"] != wanted or (wanted == "rope" and scheme != view.positional)):
                raise NotExpressible(f"model.layers[{i}].positional", f"Hugging Face {view.name}'s "
                                     f"{kind.split('_')[0]} attention layers use {wanted}")
        windows = {m["window"] for m, t in zip(mixers, types) if t == SLIDING}
        if len(windows) > 1:
            raise NotExpressible("model.layers[*].mixer.window", f"Hugging Face {view.name} has one sliding_window "
                                 f"(got {sorted(windows)})")
        if LINEAR in types:
            DeltaNetFields().write(mixers[first[LINEAR]], config, view.name, view.model.d_model)
        if "attention" in first:
            attention = mixers[first["attention"]]
            if attention.get("output_gate") or attention["qkv_bias"] != attention["out_bias"]:
                raise NotExpressible("model.block.mixer", f"Hugging Face {view.name}'s attention has no output gate and "
                                     "one attention_bias for q, k, v and o")
            n_heads = attention["n_heads"]
            config.update(num_attention_heads=n_heads, num_key_value_heads=attention.get("n_kv_heads") or n_heads,
                          head_dim=attention.get("head_dim") or view.model.d_model // n_heads,
                          attention_bias=attention["qkv_bias"])
        config.update(layer_types=types, sliding_window=windows.pop() if windows else DEFAULTS["sliding_window"])


def _in_proj_sizes(site: Site) -> list[int]:
    """The rows of a fused in_proj: q, k (key heads x key head dim each), v, z (value heads x value head dim), b, a."""
    mixer = site.mixer
    keys, values = mixer.n_kv_heads * mixer.key_head_dim, mixer.n_heads * mixer.head_dim
    return [2 * keys + values, values, mixer.n_heads, mixer.n_heads]


class SplitRows(Rule):
    """One Hugging Face tensor whose rows are several of ours, stacked (Lara-Mini's fused ``in_proj``)."""

    def __init__(self, hf: str, ours: Sequence[str], *, sizes: Any) -> None:
        self.hf, self.ours, self.sizes = (hf,), tuple(ours), sizes

    def to_ours(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        return [part.contiguous() for part in tensors[0].split(self.sizes(site))]

    def to_hf(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        return [torch.cat(tensors).contiguous()]


class Same(Rule):
    """Several tensors under other names, one for one."""

    def __init__(self, hf: Sequence[str], ours: Sequence[str]) -> None:
        self.hf, self.ours = tuple(hf), tuple(ours)

    def to_ours(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        return list(tensors)

    def to_hf(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        return list(tensors)


def lara_delta_rules() -> list[Rule]:
    ours = [f"{BLOCK_MIXER}.{x}.weight" for x in ("qkv", "z", "b", "a")]
    state = delta_state_rules()
    saved_norm = Copy(f"{LINEAR_ATTN}.out_norm.weight", f"{BLOCK_MIXER}.norm.weight")
    return at_linear([
        OneOf(SplitRows(f"{LINEAR_ATTN}.in_proj.weight", ours, sizes=_in_proj_sizes),
              Same([f"{LINEAR_ATTN}.in_proj_{x}.weight" for x in ("qkv", "z", "b", "a")], ours)),
        DepthwiseConv(f"{LINEAR_ATTN}.conv1d.weight", f"{BLOCK_MIXER}.conv_weight"),
        *(OneOf(saved_norm, rule) if rule.ours == saved_norm.ours else rule for rule in state),
    ])


FAMILY = decoder_family(
    name="Lara-Mini",
    model_type="lara_mini",
    architecture="LaraMiniForCausalLM",
    defaults=DEFAULTS,
    parts=[
        Sizes(), Rope(other_layers=("none",)), Layout("prenorm"), RMSNorm(), LaraMixers(),
        MixtureOfExperts(hidden="moe_intermediate_size", normalize="norm_topk_prob", shared=True, shared_gate=False,
                         saves_fused=True),
    ],
    extra_rules=[*lara_delta_rules(), *olmo_attention_rules()],
    maps="layer_types -> per-layer mixers: linear_attention gated_deltanet (the linear_* fields, gated norm eps "
         "rms_norm_eps), sliding_attention attention with window sliding_window and rope, full_attention attention with "
         "positional none; attention with qk_norm RMSNorm per head, head_dim, attention_bias; prenorm RMSNorm; ffn moe in "
         "every layer (num_experts, num_experts_per_tok, moe_intermediate_size, softmax then top-k, norm_topk_prob) with "
         "one ungated shared expert of shared_expert_intermediate_size; in_proj / out_norm (the checkpoints' names) or "
         "in_proj_qkv, in_proj_z, in_proj_b, in_proj_a / norm",
    caveats="the Gated DeltaNet's convolution uses hidden_act, which must be silu; the router's logits are computed in "
            "the model's dtype (transformers computes them in float32); a config with no sliding layer is written "
            "with sliding_window 512",
)
