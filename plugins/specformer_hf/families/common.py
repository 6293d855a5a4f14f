"""What Hugging Face families share, as data: two-way helpers, declarative parts, and the family builder.

A Llama-like family is written as a table (see :func:`decoder_family`): the transformers
config defaults, and a list of :class:`Part` objects, each stating one mapping in both
directions -- which ``config.json`` fields become which spec fields, and back -- together
with the checkpoint tensors it accounts for::

    FAMILY = decoder_family(
        name="Mistral", model_type="mistral", architecture="MistralForCausalLM", defaults=DEFAULTS,
        parts=[*LLAMA_PARTS, Value("sliding_window", "attention.window")],
    )

``to_spec`` (config -> spec) runs every part's :meth:`Part.read` in order;
``to_config`` (spec -> config) every part's :meth:`Part.write`; the weight rules are the
parts' :meth:`Part.rules`. Export reads its own config back with ``to_spec`` and compares the
maths, so a part only needs to refuse what it cannot write with a clear message.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from specformer.errors import UserError
from specformer_layers import default_gated_hidden  # the width a gated FFN with hidden: null builds

from specformer_hf.config import ACTIVATIONS_TO_HF, ConfigReader, activation_from_hf, rope_parameters
from specformer_hf.family import Family
from specformer_hf.rules import Copy, Fused, OneOf, PerExpert, Rule, Site, halves, qkv_sizes
from specformer_hf.specview import NotExpressible, SpecView

GATED_FFNS = ("swiglu", "geglu", "reglu")
_GATED_KIND = {"silu": "swiglu", "gelu": "geglu", "gelu_tanh": "geglu", "relu": "reglu"}


# -- sizes --------------------------------------------------------------------------------


def model_sizes(cfg: ConfigReader) -> dict[str, Any]:
    """The spec's top-level sizes and head tying."""
    return {
        "vocab_size": cfg.get_int("vocab_size"),
        "d_model": cfg.get_int("hidden_size"),
        "n_layers": cfg.get_layers("num_hidden_layers"),
        "context_length": cfg.get_int("max_position_embeddings"),
        "tie_embeddings": bool(cfg.get("tie_word_embeddings")),
    }


def model_sizes_config(view: SpecView) -> dict[str, Any]:
    m = view.model
    return {
        "vocab_size": m.vocab_size,
        "hidden_size": m.d_model,
        "num_hidden_layers": m.n_layers,
        "max_position_embeddings": m.context_length,
        "tie_word_embeddings": m.tie_embeddings,
    }


def attention_sizes(cfg: ConfigReader) -> dict[str, Any]:
    """n_heads, n_kv_heads, head_dim of the attention (head_dim: null means hidden / heads)."""
    n_heads = cfg.get_size("num_attention_heads")
    n_kv = cfg.get("num_key_value_heads", None) or n_heads
    head_dim = cfg.get("head_dim", None) or cfg.get_size("hidden_size") // n_heads
    return {"kind": "attention", "n_heads": n_heads, "n_kv_heads": n_kv, "head_dim": head_dim}


def attention_sizes_config(view: SpecView, family: str) -> dict[str, Any]:
    view.block_kind("attention", ("attention",), family=family)
    for key in ("n_heads", "n_kv_heads", "head_dim"):
        view.uniform("attention", key, family=family)
    n_heads, n_kv, head_dim = view.attention_sizes()
    return {"num_attention_heads": n_heads, "num_key_value_heads": n_kv, "head_dim": head_dim}


# -- feed-forward -----------------------------------------------------------------------------


def gated_ffn(cfg: ConfigReader, *, act_key: str = "hidden_act", bias: bool = False) -> dict[str, Any]:
    activation = activation_from_hf(cfg, act_key)
    kind = _GATED_KIND.get(activation, "swiglu")
    return {"kind": kind, "hidden": cfg.get_int("intermediate_size"), "activation": activation, "bias": bias}


def gated_ffn_config(view: SpecView, family: str, *, act_key: str = "hidden_act") -> dict[str, Any]:
    view.block_kind("ffn", GATED_FFNS, family=family)
    hidden = view.uniform("ffn", "hidden", family=family) or default_gated_hidden(view.model.d_model)
    return {"intermediate_size": hidden, act_key: ACTIVATIONS_TO_HF[view.uniform("ffn", "activation", family=family)]}


# -- norms ----------------------------------------------------------------------------------


def rmsnorm(cfg: ConfigReader, *, eps_key: str = "rms_norm_eps", offset: float = 0.0) -> dict[str, Any]:
    norm: dict[str, Any] = {"kind": "rmsnorm", "eps": cfg.get_float(eps_key)}
    if offset:
        norm["offset"] = offset
    return norm


def rmsnorm_config(view: SpecView, family: str, *, eps_key: str = "rms_norm_eps") -> dict[str, Any]:
    view.block_kind("norm", ("rmsnorm",), family=family)
    return {eps_key: view.uniform("norm", "eps", family=family)}


# -- rotary positions -----------------------------------------------------------------------------

#: transformers rope_type -> (specformer rope_scaling kind, {config key: param}); "default" has no scaling.
ROPE_SCALINGS: dict[str, tuple[str, dict[str, str]]] = {
    "linear": ("linear", {"factor": "factor"}),
    "dynamic": ("dynamic", {"factor": "factor"}),
    "yarn": ("yarn", {
        "factor": "factor", "original_max_position_embeddings": "original_context_length", "beta_fast": "beta_fast",
        "beta_slow": "beta_slow", "mscale": "mscale", "mscale_all_dim": "mscale_all_dim",
        "attention_factor": "attention_factor", "truncate": "truncate",
    }),
    "llama3": ("llama3", {
        "factor": "factor", "low_freq_factor": "low_freq_factor", "high_freq_factor": "high_freq_factor",
        "original_max_position_embeddings": "original_context_length",
    }),
    "longrope": ("longrope", {
        "short_factor": "short_factor", "long_factor": "long_factor", "factor": "factor",
        "original_max_position_embeddings": "original_context_length", "attention_factor": "attention_factor",
    }),
}
ROPE_TYPES = ("default", *ROPE_SCALINGS)
#: Scalings whose original context transformers takes from the rope parameters (else max_position_embeddings).
_NEEDS_ORIGINAL = ("yarn", "llama3", "longrope")


def rope(cfg: ConfigReader, *, rope_types: tuple[str, ...] = ROPE_TYPES, extra_legacy: dict[str, str] | None = None,
         original_override: str | None = None, partial: bool = False) -> dict[str, Any]:
    """The ``rope`` positional scheme of a config's rope parameters (theta, partial rotary, scaling).

    ``original_override`` names a top-level config field that, when the family's config has
    it, replaces the rope parameters' original_max_position_embeddings (Phi-3). ``partial``:
    whether the family's attention rotates part of each head (GPT-NeoX, Phi-3); the others
    rotate whole heads whatever partial_rotary_factor says.
    """
    params = rope_parameters(cfg, extra_legacy={"partial_rotary_factor": "partial_rotary_factor", **(extra_legacy or {})})
    rope_type = params.pop("rope_type")
    if rope_type not in rope_types:
        raise UserError(
            f"{cfg.family}: rope_type {rope_type!r} (config.json rope_parameters/rope_scaling) is not supported; "
            f"supported: {', '.join(rope_types)}"
        )
    out: dict[str, Any] = {"kind": "rope", "theta": float(params.pop("rope_theta"))}
    fraction = float(params.pop("partial_rotary_factor", 1.0) or 1.0)
    if fraction != 1.0:
        if not partial:
            raise UserError(
                f"{cfg.family}: partial_rotary_factor {fraction} is not supported: transformers' {cfg.family} "
                "rotates whole heads (GPT-NeoX and Phi-3 rotate part of each head)"
            )
        out["fraction"] = fraction
    if rope_type == "default":
        _warn_unused(cfg, rope_type, params)
        return out
    kind, names = ROPE_SCALINGS[rope_type]
    if rope_type in _NEEDS_ORIGINAL:
        if original_override and cfg.get(original_override, None) is not None:
            params["original_max_position_embeddings"] = cfg.get(original_override)
        params.setdefault("original_max_position_embeddings", cfg.get_int("max_position_embeddings"))
    scaling = {"kind": kind}
    if rope_type == "yarn":
        # transformers truncates YaRN's correction range unless told otherwise; written out, an export of the
        # spec says the same and reads back to the same spec.
        params.setdefault("truncate", True)
    for key, name in names.items():
        if params.get(key) is not None:
            scaling[name] = params.pop(key)
        else:
            params.pop(key, None)
    _warn_unused(cfg, rope_type, params)
    out["scaling"] = scaling
    return out


def _warn_unused(cfg: ConfigReader, rope_type: str, params: dict[str, Any]) -> None:
    for key in params:  # transformers ignores them too (with a warning of its own)
        cfg.note_unused(f"rope_parameters.{key} (not used by rope_type {rope_type!r})")


def rope_config(view: SpecView, family: str, *, legacy_theta: str | None = "rope_theta",
                rope_types: tuple[str, ...] = ROPE_TYPES, partial: bool = False,
                other_layers: tuple[str, ...] = ()) -> dict[str, Any]:
    """``rope_parameters`` (transformers 5) plus the legacy fields transformers 4 reads.

    ``other_layers``: positional kinds some layers may have instead, which the family maps
    elsewhere (``none`` for NoPE layers)."""
    view.one_positional(family=family, except_kinds=other_layers)
    pos = view.expect(view.positional, "model.positional", ("rope",), family=family)
    params = rope_parameters_of(pos, family, path="model.positional", rope_types=rope_types, partial=partial,
                                context_length=view.model.context_length)
    scaling = pos.get("scaling")
    out: dict[str, Any] = {"rope_parameters": params}
    if scaling:
        out["rope_scaling"] = dict(params)  # transformers 4 reads this (5 too, and finds the same)
    elif legacy_theta:
        out[legacy_theta] = pos["theta"]
    return out


def rope_parameters_of(pos: dict[str, Any], family: str, *, path: str, context_length: int,
                       rope_types: tuple[str, ...] = ROPE_TYPES, partial: bool = False) -> dict[str, Any]:
    """One ``rope`` scheme (full params) as transformers' rope parameters; NotExpressible (at ``path``) otherwise."""
    if pos["kind"] != "rope":
        raise NotExpressible(f"{path}.kind", f"{pos['kind']!r} has no equivalent in Hugging Face {family} (which uses 'rope')")
    if pos.get("interleaved"):
        raise NotExpressible(f"{path}.interleaved", f"interleaved (GPT-J style) rotary pairs have no equivalent in Hugging Face {family}")
    params: dict[str, Any] = {"rope_type": "default", "rope_theta": pos["theta"]}
    if pos.get("fraction", 1.0) != 1.0:
        if not partial:
            raise NotExpressible(f"{path}.fraction", f"{pos['fraction']}: Hugging Face {family} rotates whole heads")
        params["partial_rotary_factor"] = pos["fraction"]
    scaling = pos.get("scaling")
    if scaling:
        rope_type = next((t for t, (kind, _) in ROPE_SCALINGS.items() if kind == scaling["kind"]), None)
        if rope_type is None or rope_type not in rope_types:
            raise NotExpressible(f"{path}.scaling.kind", f"{scaling['kind']!r} has no equivalent in Hugging Face {family}")
        params["rope_type"] = rope_type
        if rope_type == "dynamic" and scaling.get("original_context_length") not in (None, context_length):
            raise NotExpressible(
                f"{path}.scaling.original_context_length",
                f"Hugging Face dynamic scaling starts at max_position_embeddings (the context_length, {context_length})",
            )
        for key, name in ROPE_SCALINGS[rope_type][1].items():
            if scaling.get(name) is not None:
                params[key] = scaling[name]
    return params


# -- sliding windows ------------------------------------------------------------------------------


def window_layers(base_window: int | None, windows: list[int | None]) -> list[dict[str, Any]]:
    """Per-layer overrides giving layer i ``windows[i]`` when the block's window is ``base_window``."""
    overrides = []
    for window in sorted({w for w in windows if w != base_window}, key=lambda w: (w is None, w or 0)):
        indices = [i for i, w in enumerate(windows) if w == window]
        overrides.append({"select": _selection(indices, len(windows)), "attention": {"window": window}})
    return overrides


def _selection(indices: list[int], n_layers: int) -> Any:
    """A readable selection: an index, a slice such as '0::2' or '1:5', else the list."""
    if len(indices) == 1:
        return indices[0]
    step = indices[1] - indices[0]
    suffix = f":{step}" if step != 1 else ""
    for text in (f"{indices[0]}:{suffix}" if suffix else f"{indices[0]}:", f"{indices[0]}:{indices[-1] + 1}{suffix}"):
        if list(range(n_layers))[slice(*[int(p) if p else None for p in text.split(":")])] == indices:
            return text
    return indices


def layer_types_from_config(cfg: ConfigReader, default: list[str]) -> list[str]:
    layer_types = cfg.get("layer_types", None) or default
    if len(layer_types) != cfg.get_layers("num_hidden_layers"):
        raise UserError(f"{cfg.family}: layer_types has {len(layer_types)} entries for {cfg.get('num_hidden_layers')} layers")
    bad = sorted({t for t in layer_types if t not in ("full_attention", "sliding_attention")})
    if bad:
        raise UserError(f"{cfg.family}: layer_types {bad} are not supported; supported: full_attention, sliding_attention")
    return list(layer_types)


def single_window(view: SpecView, family: str) -> int | None:
    """The one sliding window every windowed layer uses (None if no layer has one)."""
    windows = {w for w in view.per_layer("attention", "window") if w is not None}
    if len(windows) > 1:
        raise NotExpressible("model.layers[*].attention.window", f"several window sizes {sorted(windows)}; Hugging Face {family} has one sliding_window")
    return windows.pop() if windows else None


def check_rotary_dim(cfg: ConfigReader, n_heads: int, positional: dict[str, Any]) -> None:
    """transformers rotates int(head_dim * partial_rotary_factor) channels; an odd count has no pairing."""
    head_dim = cfg.get("head_dim", None) or cfg.get_size("hidden_size") // n_heads
    rotary = int(head_dim * positional.get("fraction", 1.0))
    if rotary % 2:
        raise UserError(
            f"{cfg.family}: partial_rotary_factor {positional.get('fraction')} rotates {rotary} of {head_dim} channels "
            "per head; an odd number cannot be split into rotation pairs"
        )


def no_output_bias(view: SpecView, family: str) -> None:
    """Families without an LM head bias or a separate final norm setting."""
    if view.model.lm_head_bias:
        raise NotExpressible("model.lm_head_bias", f"Hugging Face {family} has no LM head bias")


# -- parts: one mapping each, both directions ------------------------------------------------------

#: Where a Llama-style checkpoint keeps layer i.
LAYER = "model.layers.{i}"
ATTN = f"{LAYER}.self_attn"
MLP = f"{LAYER}.mlp"


class FamilyView:
    """A :class:`SpecView` as one family asks it: every question names the family once, here."""

    def __init__(self, view: SpecView, name: str) -> None:
        self.view, self.name = view, name

    @property
    def model(self) -> Any:
        return self.view.model

    @property
    def positional(self) -> dict[str, Any]:
        return self.view.positional

    def uniform(self, field: str, key: str | None = None) -> Any:
        return self.view.uniform(field, key, family=self.name)

    def per_layer(self, field: str, key: str | None = None) -> list[Any]:
        return self.view.per_layer(field, key)

    def block_kind(self, field: str, kinds: Sequence[str]) -> str:
        return self.view.block_kind(field, kinds, family=self.name)

    def attention_sizes(self) -> tuple[int, int, int]:
        return self.view.attention_sizes()

    def get(self, path: str) -> Any:
        """A spec value by path: ``"attention.window"`` (the same in every layer) or a model field (``"logit_softcap"``)."""
        if "." in path:
            field_name, key = path.split(".", 1)
            return self.uniform(field_name, key)
        return getattr(self.model, path)


def _set(model: dict[str, Any], path: str, value: Any) -> None:
    """Set ``"attention.window"`` in the block (creating the component dict) or a model field."""
    if "." in path:
        field_name, key = path.split(".", 1)
        model.setdefault("block", {}).setdefault(field_name, {})[key] = value
    else:
        model[path] = value


class Part:
    """One mapping between config.json fields and spec fields, and the checkpoint tensors it covers."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        """config -> spec: fill ``model`` (the spec's ``model`` section being built)."""

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        """spec -> config: add fields to ``config``; raise NotExpressible for what the family cannot hold."""

    def rules(self) -> list[Rule]:
        """The weight rules for the tensors this part accounts for."""
        return []


@dataclass(frozen=True)
class Sizes(Part):
    """vocab_size, hidden_size, num_hidden_layers, max_position_embeddings, tie_word_embeddings; embedding, final norm, head."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        model.update(model_sizes(cfg))

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        no_output_bias(view.view, view.name)
        config.update(model_sizes_config(view.view))

    def rules(self) -> list[Rule]:
        return [Copy("model.embed_tokens.weight", "embedding.weight"), Copy("model.norm.weight", "final_norm.weight"),
                Copy("lm_head.weight", "lm_head.weight")]


@dataclass(frozen=True)
class Rope(Part):
    """rope_parameters (and the legacy rope_theta / rope_scaling) <-> the ``rope`` positional scheme."""

    rope_types: tuple[str, ...] = ROPE_TYPES
    #: Whether the family's attention rotates only part of each head (partial_rotary_factor).
    partial: bool = False
    #: A top-level field that, when present, is the scaling's original context (Phi-3).
    original_override: str | None = None
    legacy_theta: str | None = "rope_theta"
    extra_legacy: Mapping[str, str] = field(default_factory=dict)
    #: Write partial_rotary_factor even when it is 1 (a family whose default is not 1: StableLM's 0.25).
    write_fraction: bool = False
    #: Positional kinds some layers may have instead of this rope, mapped by another part (NoPE layers: "none").
    other_layers: tuple[str, ...] = ()
    #: A top-level field giving the rotated channels per head, for partial_rotary_factor = it / head_dim when the
    #: config gives no factor itself (MiniMax-M2's rotary_dim).
    rotary_dim_key: str | None = None

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        if self.rotary_dim_key and cfg.get(self.rotary_dim_key, None) is not None:
            head_dim = attention_sizes(cfg)["head_dim"]
            cfg.data.setdefault("partial_rotary_factor", cfg.get_size(self.rotary_dim_key) / head_dim)
        positional = rope(cfg, rope_types=self.rope_types, extra_legacy=dict(self.extra_legacy),
                          original_override=self.original_override, partial=self.partial)
        if self.partial:
            check_rotary_dim(cfg, cfg.get_size("num_attention_heads"), positional)
        model["positional"] = positional

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        written = rope_config(view.view, view.name, legacy_theta=self.legacy_theta, rope_types=self.rope_types,
                              partial=self.partial, other_layers=self.other_layers)
        if self.write_fraction:
            fraction = written["rope_parameters"].setdefault("partial_rotary_factor", 1.0)
            written["partial_rotary_factor"] = fraction  # where transformers 4 reads it
            if "rope_scaling" in written:
                written["rope_scaling"]["partial_rotary_factor"] = fraction
        config.update(written)


#: Each layout's norm tensors, Llama-style names (our name, Hugging Face name).
_LAYOUT_NORMS: dict[str, tuple[tuple[str, str], ...]] = {
    "prenorm": (("attention_norm", "input_layernorm"), ("ffn_norm", "post_attention_layernorm")),
    "postnorm_inside": (("attention_norm", "post_attention_layernorm"), ("ffn_norm", "post_feedforward_layernorm")),
    "sandwich": (("attention_norm", "input_layernorm"), ("attention_post_norm", "post_attention_layernorm"),
                 ("ffn_norm", "pre_feedforward_layernorm"), ("ffn_post_norm", "post_feedforward_layernorm")),
    "parallel": (("attention_norm", "input_layernorm"),),  # one shared norm (GPT-J style)
}


@dataclass(frozen=True)
class Layout(Part):
    """The block layout (which fixes the norms' places and their tensor names).

    ``parallel_key`` names a boolean config field that switches to parallel attention and
    feed-forward sharing one norm (StableLM's use_parallel_residual).
    """

    kind: str = "prenorm"
    #: Norms with biases (LayerNorm) have ``.bias`` tensors too.
    norm_bias: bool = False
    parallel_key: str | None = None

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        kind = "parallel" if self.parallel_key and cfg.get(self.parallel_key) else self.kind
        model.setdefault("block", {})["layout"] = {"kind": "parallel", "shared_norm": True} if kind == "parallel" else kind

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        kind = view.block_kind("layout", (self.kind, "parallel") if self.parallel_key else (self.kind,))
        if kind == "parallel" and not view.uniform("layout", "shared_norm"):
            raise NotExpressible("model.block.layout.shared_norm", f"Hugging Face {view.name}'s parallel blocks share one norm")
        if self.parallel_key:
            config[self.parallel_key] = kind == "parallel"

    def rules(self) -> list[Rule]:
        suffixes = ("weight", "bias") if self.norm_bias else ("weight",)
        names = dict(_LAYOUT_NORMS[self.kind])
        if self.parallel_key:
            names.update(_LAYOUT_NORMS["parallel"])  # a parallel block has only the first norm: its rule is skipped otherwise
        return [Copy(f"{LAYER}.{hf}.{s}", f"blocks.{{i}}.{ours}.{s}") for ours, hf in names.items() for s in suffixes]


@dataclass(frozen=True)
class RMSNorm(Part):
    """RMSNorm everywhere, eps from ``eps_key``; ``offset`` 1 for Gemma's (1 + w) weights."""

    eps_key: str = "rms_norm_eps"
    offset: float = 0.0

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        model.setdefault("block", {})["norm"] = rmsnorm(cfg, eps_key=self.eps_key, offset=self.offset)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        config.update(rmsnorm_config(view.view, view.name, eps_key=self.eps_key))


@dataclass(frozen=True)
class LayerNorm(Part):
    """LayerNorm everywhere, eps from ``eps_key``, with a bias (the final norm's too) unless ``bias`` is False (Cohere)."""

    eps_key: str = "layer_norm_eps"
    bias: bool = True

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        norm = {"kind": "layernorm", "eps": cfg.get_float(self.eps_key)}
        if not self.bias:
            norm["bias"] = False
        model.setdefault("block", {})["norm"] = norm

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        view.block_kind("norm", ("layernorm",))
        if view.uniform("norm", "bias") != self.bias or not view.uniform("norm", "affine"):
            raise NotExpressible("model.block.norm", f"Hugging Face {view.name}'s LayerNorms have a weight "
                                 + ("and a bias" if self.bias else "and no bias"))
        config[self.eps_key] = view.uniform("norm", "eps")

    def rules(self) -> list[Rule]:
        return [Copy("model.norm.bias", "final_norm.bias")] if self.bias else []


@dataclass(frozen=True)
class Attention(Part):
    """num_attention_heads, num_key_value_heads, head_dim; q/k/v fused into our qkv, o_proj, their biases.

    ``head_dim`` False: the family's attention always uses hidden_size / num_attention_heads
    (StableLM), whatever a head_dim field says.
    """

    head_dim: bool = True

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        sizes = attention_sizes(cfg)
        if not self.head_dim:
            sizes["head_dim"] = cfg.get_size("hidden_size") // sizes["n_heads"]
        model.setdefault("block", {}).setdefault("attention", {}).update(sizes)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        sizes = attention_sizes_config(view.view, view.name)
        if not self.head_dim:
            if sizes["head_dim"] * sizes["num_attention_heads"] != view.model.d_model:
                raise NotExpressible("model.block.attention.head_dim", f"Hugging Face {view.name} has head_dim = "
                                     f"d_model / n_heads ({view.model.d_model} / {sizes['num_attention_heads']})")
            del sizes["head_dim"]
        config.update(sizes)

    def rules(self) -> list[Rule]:
        return [
            Fused([f"{ATTN}.q_proj.weight", f"{ATTN}.k_proj.weight", f"{ATTN}.v_proj.weight"],
                  "blocks.{i}.attention.qkv.weight", sizes=qkv_sizes),
            Fused([f"{ATTN}.q_proj.bias", f"{ATTN}.k_proj.bias", f"{ATTN}.v_proj.bias"],
                  "blocks.{i}.attention.qkv.bias", sizes=qkv_sizes),
            Copy(f"{ATTN}.o_proj.weight", "blocks.{i}.attention.out.weight"),
            Copy(f"{ATTN}.o_proj.bias", "blocks.{i}.attention.out.bias"),
        ]


@dataclass(frozen=True)
class Switch(Part):
    """A boolean config field that sets one or more spec fields alike (attention_bias -> qkv_bias and out_bias)."""

    key: str
    paths: tuple[str, ...]

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        value = bool(cfg.get(self.key))
        for path in self.paths:
            _set(model, path, value)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        config[self.key] = view.get(self.paths[0])  # the read-back check refuses specs where the paths differ


@dataclass(frozen=True)
class Value(Part):
    """A config field copied as is to a spec field (sliding_window -> attention.window)."""

    key: str
    path: str

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        _set(model, self.path, cfg.get(self.key))

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        config[self.key] = view.get(self.path)


@dataclass(frozen=True)
class Fixed(Part):
    """A spec field the family always has at one value (Qwen2's q/k/v biases); ``why`` says so on export."""

    path: str
    value: Any
    why: str

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        _set(model, self.path, self.value)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        if view.get(self.path) != self.value:
            where = f"model.block.{self.path}" if "." in self.path else f"model.{self.path}"
            raise NotExpressible(where, f"Hugging Face {view.name} {self.why}")


@dataclass(frozen=True)
class Refuse(Part):
    """A config field whose other values specformer cannot reproduce (a bidirectional Gemma)."""

    key: str
    allowed: tuple[Any, ...]
    why: str
    #: A field the family's config class lacks (only some config.json files have it): absent is None.
    optional: bool = False

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        if self.optional:
            cfg.require(self.key, self.allowed, why=self.why, default=None)
        else:
            cfg.require(self.key, self.allowed, why=self.why)


@dataclass(frozen=True)
class QKNorm(Part):
    """RMSNorm on queries and keys (eps rms_norm_eps): per head (Qwen3) or over all heads (OLMo-2).

    Always on, unless ``switch`` names a boolean config field that turns it on (GLM-4.5's use_qk_norm).
    """

    scope: str = "head"
    eps_key: str = "rms_norm_eps"
    #: 1 for Gemma 3's (1 + w) weights.
    offset: float = 0.0
    switch: str | None = None

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        if self.switch and not cfg.get(self.switch):
            return
        attention = model.setdefault("block", {}).setdefault("attention", {})
        attention.update(qk_norm=rmsnorm(cfg, eps_key=self.eps_key, offset=self.offset), qk_norm_scope=self.scope)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        on = view.uniform("attention", "qk_norm") is not None
        if self.switch:
            config[self.switch] = on
        elif not on:
            raise NotExpressible("model.block.attention.qk_norm", f"Hugging Face {view.name} always normalises queries and keys (qk_norm: rmsnorm)")

    def rules(self) -> list[Rule]:
        return [Copy(f"{ATTN}.q_norm.weight", "blocks.{i}.attention.q_norm.weight"),
                Copy(f"{ATTN}.k_norm.weight", "blocks.{i}.attention.k_norm.weight")]


@dataclass(frozen=True)
class GatedFFN(Part):
    """intermediate_size and the activation (``act_key``) <-> a gated feed-forward; gate/up fused, down; ``bias_key`` switches biases."""

    act_key: str = "hidden_act"
    bias_key: str | None = None
    #: Gemma's configs say "gelu" for the tanh approximation, and may name the field hidden_activation.
    gemma_gelu: bool = False

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        key = self.act_key
        if self.gemma_gelu:
            key = next((k for k in ("hidden_activation", self.act_key) if cfg.has(k) and cfg.data[k] is not None), self.act_key)
            cfg.mark_read("hidden_activation", self.act_key)
            if cfg.get(key) == "gelu":
                cfg.data[key] = "gelu_pytorch_tanh"
        bias = bool(cfg.get(self.bias_key)) if self.bias_key else False
        model.setdefault("block", {})["ffn"] = gated_ffn(cfg, act_key=key, bias=bias)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        config.update(gated_ffn_config(view.view, view.name, act_key=self.act_key))
        if self.bias_key:
            config[self.bias_key] = view.uniform("ffn", "bias")

    def rules(self) -> list[Rule]:
        return [
            Fused([f"{MLP}.gate_proj.weight", f"{MLP}.up_proj.weight"], "blocks.{i}.ffn.gate_up.weight", sizes=halves),
            Fused([f"{MLP}.gate_proj.bias", f"{MLP}.up_proj.bias"], "blocks.{i}.ffn.gate_up.bias", sizes=halves),
            Copy(f"{MLP}.down_proj.weight", "blocks.{i}.ffn.down.weight"),
            Copy(f"{MLP}.down_proj.bias", "blocks.{i}.ffn.down.bias"),
        ]


@dataclass(frozen=True)
class EmbeddingScale(Part):
    """Embeddings multiplied by sqrt(hidden_size), always (Gemma)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        model["embedding_multiplier"] = "sqrt_d_model"

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        m = view.model
        if m.embedding_multiplier != "sqrt_d_model" and float(m.embedding_multiplier) != m.d_model ** 0.5:
            raise NotExpressible("model.embedding_multiplier", f"{m.embedding_multiplier!r}: Hugging Face {view.name} always scales embeddings by sqrt(d_model)")


@dataclass(frozen=True)
class QueryScale(Part):
    """query_pre_attn_scalar s: scores scaled by s^-1/2 instead of head_dim^-1/2 (Gemma 2 and 3)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        attention = model.setdefault("block", {}).setdefault("attention", {})
        scalar = cfg.get_float("query_pre_attn_scalar")
        if scalar != attention["head_dim"]:
            attention["scale"] = scalar ** -0.5

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        _, _, head_dim = view.attention_sizes()
        scale = view.uniform("attention", "scale")
        scalar: float = head_dim
        if scale is not None:
            scalar = scale ** -2
            if math.isclose(scalar, round(scalar), rel_tol=1e-9):
                scalar = int(round(scalar))
        config["query_pre_attn_scalar"] = scalar


# -- sliding windows per layer --------------------------------------------------------------------


def _windowed(model: dict[str, Any], windows: list[int | None]) -> None:
    """The block's window is the most common one; the other layers get overrides."""
    base = max(set(windows), key=lambda w: (windows.count(w), w is None))
    model.setdefault("block", {}).setdefault("attention", {})["window"] = base
    layers = window_layers(base, windows)
    if layers:
        model.setdefault("layers", []).extend(layers)


@dataclass(frozen=True)
class LayerTypes(Part):
    """layer_types + sliding_window <-> per-layer windows; ``sliding(i)`` gives the default pattern; ``required``: a window must exist."""

    sliding: Callable[[int], bool]
    required: bool = False

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        n_layers = cfg.get_layers("num_hidden_layers")
        types = layer_types_from_config(cfg, ["sliding_attention" if self.sliding(i) else "full_attention" for i in range(n_layers)])
        window = cfg.get("sliding_window")
        _windowed(model, [window if t == "sliding_attention" else None for t in types])

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        window = single_window(view.view, view.name)
        if window is None and self.required:
            raise NotExpressible("model.layers[*].attention.window", f"Hugging Face {view.name} needs sliding-window layers (sliding_window)")
        config["sliding_window"] = window
        config["layer_types"] = ["sliding_attention" if w is not None else "full_attention"
                                 for w in view.per_layer("attention", "window")]


LAYER_TYPES = ("sliding_attention", "full_attention")


@dataclass(frozen=True)
class LayerTypeRopes(Part):
    """layer_types (default: every ``pattern``-th layer global), sliding_window and rope_parameters per layer type
    <-> per-layer windows and per-layer rope schemes (Gemma 3, OLMo 3).

    transformers 5 writes ``rope_parameters: {sliding_attention: {...}, full_attention: {...}}``. Older files have
    ``rope_theta`` and ``rope_scaling`` for the global layers and, for the sliding ones, ``local_theta_key``
    (Gemma 3's rope_local_base_freq) or else the family's default ``theta``. ``pattern_key``: the config field
    that may change the pattern. ``flat_is_full``: a flat rope_parameters (no layer types) is the global layers'
    (Gemma 3); False: refused, as transformers' OLMo 3 ignores it.
    """

    pattern: int
    theta: Mapping[str, float]
    pattern_key: str | None = "sliding_window_pattern"
    local_theta_key: str | None = None
    flat_is_full: bool = True

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        n_layers = cfg.get_layers("num_hidden_layers")
        pattern = self.pattern
        if self.pattern_key:
            pattern = cfg.get(self.pattern_key, pattern)
            # transformers 5 saves the pattern as _sliding_window_pattern; layer_types, always saved too, say the same.
            cfg.mark_read(f"_{self.pattern_key}")
        types = layer_types_from_config(cfg, ["sliding_attention" if (i + 1) % pattern else "full_attention"
                                              for i in range(n_layers)])
        window = cfg.get("sliding_window")
        _windowed(model, [window if t == "sliding_attention" else None for t in types])
        schemes = {t: self._rope(cfg, t) for t in LAYER_TYPES}
        base = max(LAYER_TYPES, key=types.count)  # the scheme of most layers is the model's
        model["positional"] = schemes[base]
        other = [i for i, t in enumerate(types) if t != base]
        if other and schemes[base] != schemes[types[other[0]]]:
            model.setdefault("layers", []).append({"select": _selection(other, n_layers), "positional": schemes[types[other[0]]]})

    def _rope(self, cfg: ConfigReader, layer_type: str) -> dict[str, Any]:
        cfg.mark_read("rope_parameters", "rope_scaling", "rope_theta", *([self.local_theta_key] if self.local_theta_key else []))
        stored = cfg.data.get("rope_parameters")
        if isinstance(stored, dict) and any(t in stored for t in LAYER_TYPES):
            params = dict(stored.get(layer_type) or {})
        elif stored is not None and cfg.data.get("rope_scaling") is None and not self.flat_is_full:
            raise UserError(f"{cfg.family}: rope_parameters {stored!r} has no per-layer-type entries, which transformers' "
                            f"{cfg.family} ignores; write {{sliding_attention: {{...}}, full_attention: {{...}}}}")
        elif layer_type == "full_attention":
            params = {**(cfg.data.get("rope_scaling") or stored or {})}
            if cfg.data.get("rope_theta") is not None:
                params.setdefault("rope_theta", cfg.data["rope_theta"])
        else:
            params = {"rope_type": "default"}
            if self.local_theta_key and cfg.data.get(self.local_theta_key) is not None:
                params["rope_theta"] = cfg.data[self.local_theta_key]
        if not isinstance(params, dict):
            raise UserError(f"{cfg.family}: rope parameters of {layer_type} layers must be a mapping, got {params!r}")
        params.setdefault("rope_theta", self.theta[layer_type])
        # One layer type's rope, read by the shared rope reader as if it were the whole config's.
        single = ConfigReader({"rope_parameters": params, "max_position_embeddings": cfg.get("max_position_embeddings")},
                              defaults={}, family=f"{cfg.family} ({layer_type} layers)")
        scheme = rope(single)
        cfg.unused.extend(single.unused)
        return scheme

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        windows = view.per_layer("attention", "window")
        sliding = {w for w in windows if w is not None}
        if len(sliding) > 1:
            raise NotExpressible("model.layers[*].attention.window", f"several window sizes {sorted(sliding)}; Hugging Face {view.name} has one sliding_window")
        types = ["sliding_attention" if w is not None else "full_attention" for w in windows]
        schemes = [scheme or view.positional for scheme in view.per_layer("positional")]
        params: dict[str, Any] = {}
        for layer_type in LAYER_TYPES:
            mine = [(i, s) for i, (t, s) in enumerate(zip(types, schemes)) if t == layer_type]
            for i, scheme in mine[1:]:
                if scheme != mine[0][1]:
                    raise NotExpressible(f"model.layers[{i}].positional", f"differs from layer {mine[0][0]}'s; Hugging Face "
                                         f"{view.name} has one rope for all {layer_type} layers")
            if mine:
                params[layer_type] = rope_parameters_of(mine[0][1], view.name, path=f"model.layers[{mine[0][0]}].positional",
                                                        context_length=view.model.context_length)
        for layer_type in LAYER_TYPES:  # a type no layer has still needs parameters
            params.setdefault(layer_type, next(iter(params.values())))
        config.update(rope_parameters=params, layer_types=types, sliding_window=sliding.pop() if sliding else None)


@dataclass(frozen=True)
class SlidingRopeGlobalNope(Part):
    """layer_types (default: every sliding_window_pattern-th layer global), sliding_window and rope_parameters <->
    per-layer windows, a rope on the sliding layers and ``positional: none`` on the global ones (Cohere2, EXAONE 4).

    ``interleaved``: the rope rotates adjacent pairs (Cohere). ``rope_without_window``: with sliding_window null
    every layer is global and has the rope (EXAONE 4, whose attention skips the rope only on the global layers
    of a model with windows).
    """

    interleaved: bool = False
    rope_without_window: bool = False
    pattern: int = 4

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        n_layers = cfg.get_layers("num_hidden_layers")
        window = cfg.get("sliding_window")
        pattern = cfg.get("sliding_window_pattern", self.pattern)
        cfg.mark_read("_sliding_window_pattern")
        if self.rope_without_window and window is None:
            default = ["full_attention"] * n_layers
        elif isinstance(pattern, int) and not isinstance(pattern, bool) and pattern >= 1:
            default = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n_layers)]
        elif cfg.get("layer_types", None) is not None:
            default = []  # layer_types decide (EXAONE 4's "LLLG" beside them)
        else:
            raise UserError(f"{cfg.family}: sliding_window_pattern {pattern!r} without layer_types is not supported "
                            "(transformers builds layer_types from a positive integer only); give layer_types")
        types = layer_types_from_config(cfg, default)
        model["positional"] = {**rope(cfg), "interleaved": True} if self.interleaved else rope(cfg)
        if self.rope_without_window and window is None:
            if "sliding_attention" in types:
                raise UserError(f"{cfg.family}: layer_types names sliding_attention layers but sliding_window is null; "
                                "set sliding_window, or make every layer full_attention")
            _windowed(model, [None] * n_layers)
            return
        _windowed(model, [window if t == "sliding_attention" else None for t in types])
        full = [i for i, t in enumerate(types) if t == "full_attention"]
        if full:
            model.setdefault("layers", []).append({"select": _selection(full, n_layers), "positional": "none"})

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        windows = view.per_layer("attention", "window")
        sliding = {w for w in windows if w is not None}
        schemes = [scheme or view.positional for scheme in view.per_layer("positional")]
        everywhere = self.rope_without_window and not sliding and all(s == view.positional for s in schemes)
        if len(sliding) != 1 and not everywhere:
            raise NotExpressible("model.layers[*].attention.window", f"Hugging Face {view.name} has one sliding_window "
                                 f"on its local layers (got {sorted(sliding) or 'none'})"
                                 + (", or none and the rope on every layer" if self.rope_without_window else ""))
        for i, (window, scheme) in enumerate(zip(windows, schemes)):
            wanted = "rope" if window is not None or everywhere else "none"
            if scheme["kind"] != wanted or (wanted == "rope" and scheme != view.positional):
                raise NotExpressible(f"model.layers[{i}].positional", f"Hugging Face {view.name}'s "
                                     f"{'sliding' if window else 'global'} layers use {wanted}"
                                     + (" (model.positional)" if wanted == "rope" else ""))
        pos = view.positional
        if bool(pos.get("interleaved")) != self.interleaved:
            raise NotExpressible("model.positional.interleaved", f"Hugging Face {view.name} rotates "
                                 + ("adjacent pairs (interleaved: true)" if self.interleaved else "halves (interleaved: false)"))
        params = rope_parameters_of({**pos, "interleaved": False}, view.name, path="model.positional",
                                    context_length=view.model.context_length)
        config.update(rope_parameters=params, sliding_window=sliding.pop() if sliding else None,
                      layer_types=["sliding_attention" if w is not None else "full_attention" for w in windows])


@dataclass(frozen=True)
class QwenWindows(Part):
    """use_sliding_window, sliding_window, max_window_layers (transformers 4) and layer_types <-> per-layer windows."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        window = cfg.get("sliding_window")  # read either way: it matters only with use_sliding_window
        window = window if cfg.get("use_sliding_window") else None
        n_layers, first_sliding = cfg.get_layers("num_hidden_layers"), cfg.get_int("max_window_layers")
        default = ["sliding_attention" if window is not None and i >= first_sliding else "full_attention" for i in range(n_layers)]
        types = layer_types_from_config(cfg, default)
        if window is None and "sliding_attention" in types:  # transformers cannot build their mask either
            raise UserError(f"{cfg.family}: layer_types names sliding_attention layers but there is no window "
                            "(use_sliding_window false or sliding_window null); set both, or make every layer full_attention")
        _windowed(model, [window if t == "sliding_attention" else None for t in types])

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        window = single_window(view.view, view.name)
        types = ["sliding_attention" if w is not None else "full_attention" for w in view.per_layer("attention", "window")]
        sliding = [i for i, t in enumerate(types) if t == "sliding_attention"]
        # max_window_layers is what transformers 4 reads; it only describes "every layer from k on".
        first = sliding[0] if sliding and sliding == list(range(sliding[0], len(types))) else len(types)
        config.update(use_sliding_window=window is not None, sliding_window=window, max_window_layers=first, layer_types=types)


def no_rope_flags(cfg: ConfigReader, n_layers: int) -> list[int]:
    """SmolLM3's no_rope_layers (1: rope, 0: no positions), or every ``no_rope_layer_interval``-th layer without rope."""
    flags = cfg.get("no_rope_layers", None)
    interval = cfg.get_size("no_rope_layer_interval")
    if flags is None:
        flags = [int((i + 1) % interval != 0) for i in range(n_layers)]
    if not isinstance(flags, list) or len(flags) != n_layers or any(f not in (0, 1) for f in flags):
        raise UserError(f"{cfg.family}: no_rope_layers must hold a 0 or 1 for each of the {n_layers} layers, got {flags!r}")
    return flags


@dataclass(frozen=True)
class NoRopeLayers(Part):
    """no_rope_layers (1: rope, 0: no positions) or every ``no_rope_layer_interval``-th layer without rope (SmolLM3)
    <-> ``layers: [{select: ..., positional: none}]`` overrides."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        n_layers = cfg.get_layers("num_hidden_layers")
        nope = [i for i, use_rope in enumerate(no_rope_flags(cfg, n_layers)) if not use_rope]
        if nope:
            model.setdefault("layers", []).append({"select": _selection(nope, n_layers), "positional": "none"})

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        kinds = [scheme["kind"] if scheme else view.positional["kind"] for scheme in view.per_layer("positional")]
        config["no_rope_layers"] = [int(kind != "none") for kind in kinds]


# -- mixtures of experts ------------------------------------------------------------------------------


def _n_experts(site: Site) -> int:
    return getattr(site.ffn, "n_experts", 0)  # 0 in a dense layer: no expert tensors there


def expert_rules(*, saved: str, fused: str = MLP, gate: str = "gate_proj", up: str = "up_proj",
                 down: str = "down_proj") -> list[Rule]:
    """Router and experts, read from either layout transformers uses, written per expert as it saves them.

    ``saved`` is the module that ``save_pretrained`` writes: ``{saved}.gate.weight`` (the
    router) and, per expert j, ``{saved}.experts.{j}.{gate|up|down}.weight``. ``fused`` is
    transformers 5's module as it is in memory (and in files saved from it as they are):
    ``{fused}.gate.weight``, ``{fused}.experts.gate_up_proj`` (n_experts, 2 * hidden, d_model)
    = [gate; up] per expert, exactly our ``experts_in``, and ``{fused}.experts.down_proj``
    (n_experts, d_model, hidden) = our ``experts_out``.
    """
    router = Copy(f"{saved}.gate.weight", "blocks.{i}.ffn.router.weight")
    return [
        router if saved == fused else OneOf(router, Copy(f"{fused}.gate.weight", "blocks.{i}.ffn.router.weight")),
        OneOf(PerExpert([f"{saved}.experts.{{j}}.{gate}.weight", f"{saved}.experts.{{j}}.{up}.weight"],
                        "blocks.{i}.ffn.experts_in", n_experts=_n_experts),
              Copy(f"{fused}.experts.gate_up_proj", "blocks.{i}.ffn.experts_in")),
        OneOf(PerExpert([f"{saved}.experts.{{j}}.{down}.weight"], "blocks.{i}.ffn.experts_out", n_experts=_n_experts),
              Copy(f"{fused}.experts.down_proj", "blocks.{i}.ffn.experts_out")),
    ]


def _shared_halves(site: Site) -> tuple[int, int]:
    hidden = site.ffn.shared.hidden
    return hidden, hidden


def _plain_sigmoid_router(router: dict[str, Any] | None, family: str, *, always_normalize: bool) -> bool:
    """The ``normalize`` of a sigmoid_topk router with no groups, scaling or score bias; NotExpressible otherwise."""
    plain = {"n_group": 1, "topk_group": 1, "scaling_factor": 1.0, "bias": False}
    if (router or {}).get("kind") != "sigmoid_topk" or any(router.get(k, v) != v for k, v in plain.items()) \
            or (always_normalize and not router.get("normalize", True)):
        raise NotExpressible("model.block.ffn.router", f"Hugging Face {family} routes with sigmoid_topk (a selection bias, "
                             "no groups, scaling_factor 1, no score bias" + (", normalize: true)" if always_normalize else ")"))
    return bool(router.get("normalize", True))


@dataclass(frozen=True)
class MixtureOfExperts(Part):
    """A routed mixture of gated experts (softmax over all experts, then top-k), in place of the gated feed-forward.

    ``n_experts``, ``hidden`` and ``normalize`` name the family's config fields (``normalize``
    None: the top-k weights are always renormalised, as Mixtral's router does); ``saved``
    and the expert tensor names as in :func:`expert_rules`. ``shared``: one always-on gated
    expert of width shared_expert_intermediate_size scaled by sigmoid(shared_expert_gate . x)
    (Qwen2-MoE). ``dense``: decoder_sparse_step and mlp_only_layers make some layers a plain
    gated feed-forward of width intermediate_size (Qwen-MoE), written as ``layers:`` overrides.
    ``selection_bias``: the names (saved, in memory) of a per-expert bias that only picks experts; the
    router is then ``sigmoid_topk`` (sigmoid scores, the chosen ones renormalised; MiniMax-M2).
    """

    n_experts: str = "num_experts"
    hidden: str = "intermediate_size"
    normalize: str | None = None
    saved: str = MLP
    gate: str = "gate_proj"
    up: str = "up_proj"
    down: str = "down_proj"
    shared: bool = False
    dense: bool = False
    #: Other names config.json may give the expert count (Qwen3-MoE saves num_local_experts, its hub files num_experts).
    n_experts_aliases: tuple[str, ...] = ()
    selection_bias: tuple[str, ...] = ()

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        activation = activation_from_hf(cfg, "hidden_act")
        count_key = next((k for k in (self.n_experts, *self.n_experts_aliases) if cfg.has(k)), self.n_experts)
        cfg.mark_read(*self.n_experts_aliases)
        ffn: dict[str, Any] = {
            "kind": "moe",
            "n_experts": cfg.get_int(count_key),
            "top_k": cfg.get_int("num_experts_per_tok"),
            "hidden": cfg.get_int(self.hidden),
            "activation": activation,
            "gated": True,
            "routing": "softmax_then_topk",
            "normalize_topk": bool(cfg.get(self.normalize)) if self.normalize else True,
            "aux_loss_coef": cfg.get_float("router_aux_loss_coef"),
        }
        if self.selection_bias:
            ffn["router"] = {"kind": "sigmoid_topk", "normalize": ffn.pop("normalize_topk")}
            del ffn["routing"]
        if self.shared:
            ffn.update(n_shared_experts=1, shared_hidden=cfg.get_int("shared_expert_intermediate_size"), shared_gate=True)
        model.setdefault("block", {})["ffn"] = ffn
        if self.dense:
            n_layers, step = cfg.get_layers("num_hidden_layers"), cfg.get_size("decoder_sparse_step")
            only = cfg.get("mlp_only_layers") or []
            if not isinstance(only, list) or not all(isinstance(i, int) and 0 <= i < n_layers for i in only):
                raise UserError(f"{cfg.family}: mlp_only_layers must list layer indices below {n_layers}, got {only!r}")
            dense = [i for i in range(n_layers) if i in only or (i + 1) % step != 0]
            if dense:
                swiglu = {"kind": _GATED_KIND.get(activation, "swiglu"), "hidden": cfg.get_int("intermediate_size"),
                          "activation": activation}
                model.setdefault("layers", []).append({"select": dense[0] if len(dense) == 1 else dense, "ffn": swiglu})
            else:
                cfg.mark_read("intermediate_size")  # only dense layers use it: inert here, not worth a warning

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        kinds = view.per_layer("ffn", "kind")
        moe = [layer["ffn"] for layer in view.view.layers if layer["ffn"]["kind"] == "moe"]
        dense = [i for i, kind in enumerate(kinds) if kind != "moe"]
        if not moe:
            raise NotExpressible("model.block.ffn.kind", f"Hugging Face {view.name} needs mixture-of-experts layers (moe)")
        if dense and not self.dense:
            raise NotExpressible("model.layers[*].ffn.kind", f"Hugging Face {view.name} has experts in every layer")
        if any(f != moe[0] for f in moe[1:]):
            raise NotExpressible("model.layers[*].ffn", f"the moe layers differ; Hugging Face {view.name} has one expert setting")
        ffn = moe[0]
        normalize = ffn["normalize_topk"]
        if self.selection_bias:
            normalize = _plain_sigmoid_router(ffn.get("router"), view.name, always_normalize=self.normalize is None)
        elif ffn.get("router") is not None:
            raise NotExpressible("model.block.ffn.router", f"Hugging Face {view.name}'s router is the default softmax top-k "
                                 "(write it with routing and normalize_topk)")
        for key, wanted in (("expert_bias", False), ("swiglu_limit", None), ("routing", "softmax_then_topk"), ("gated", True)):
            if ffn.get(key, wanted) != wanted:
                raise NotExpressible(f"model.block.ffn.{key}", f"{ffn.get(key)!r}: Hugging Face {view.name} has {wanted!r}")
        hidden = ffn["hidden"] or default_gated_hidden(view.model.d_model)
        config.update({
            self.n_experts: ffn["n_experts"],
            "num_experts_per_tok": ffn["top_k"],
            self.hidden: hidden,
            "hidden_act": ACTIVATIONS_TO_HF[ffn["activation"]],
            "router_aux_loss_coef": ffn["aux_loss_coef"],
        })
        if self.normalize:
            config[self.normalize] = normalize
        if self.shared:
            if ffn.get("n_shared_experts") != 1 or not ffn.get("shared_gate"):
                raise NotExpressible("model.block.ffn.n_shared_experts", f"Hugging Face {view.name} has one gated shared expert "
                                     "(n_shared_experts: 1, shared_gate: true)")
            config["shared_expert_intermediate_size"] = ffn.get("shared_hidden") or hidden
        elif ffn.get("n_shared_experts"):
            raise NotExpressible("model.block.ffn.n_shared_experts", f"Hugging Face {view.name} has no shared experts")
        if self.dense:
            config.update(decoder_sparse_step=1, mlp_only_layers=dense)
            widths = {view.view.layers[i]["ffn"].get("hidden") or default_gated_hidden(view.model.d_model) for i in dense}
            if len(widths) > 1:
                raise NotExpressible("model.layers[*].ffn.hidden", f"dense layers of widths {sorted(widths)}; Hugging Face "
                                     f"{view.name} has one intermediate_size")
            if dense:
                config["intermediate_size"] = widths.pop()

    def rules(self) -> list[Rule]:
        rules = expert_rules(saved=self.saved, gate=self.gate, up=self.up, down=self.down)
        if self.selection_bias:
            rules.append(OneOf(*(Copy(name, "blocks.{i}.ffn.router.selection_bias") for name in self.selection_bias)))
        if self.shared:
            rules += [
                Fused([f"{MLP}.shared_expert.gate_proj.weight", f"{MLP}.shared_expert.up_proj.weight"],
                      "blocks.{i}.ffn.shared.gate_up.weight", sizes=_shared_halves),
                Copy(f"{MLP}.shared_expert.down_proj.weight", "blocks.{i}.ffn.shared.down.weight"),
                Copy(f"{MLP}.shared_expert_gate.weight", "blocks.{i}.ffn.shared_gate.weight"),
            ]
        if self.dense:
            rules += GatedFFN().rules()  # the dense layers' mlp (a rule whose parameters a layer lacks is skipped)
        return rules


@dataclass(frozen=True)
class GroupedExperts(Part):
    """n_routed_experts, num_experts_per_tok, moe_intermediate_size, n_shared_experts, norm_topk_prob,
    routed_scaling_factor, n_group, topk_group, first_k_dense_replace <-> ffn moe with a sigmoid_topk router
    (e_score_correction_bias is its selection_bias) and ``layers:`` overrides for the dense first layers
    (DeepSeek-V3's experts, which GLM-4.5 shares field for field and tensor for tensor)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        activation = activation_from_hf(cfg, "hidden_act")
        n_shared = cfg.get_int("n_shared_experts") or 0
        ffn: dict[str, Any] = {
            "kind": "moe",
            "n_experts": cfg.get_int("n_routed_experts"),
            "top_k": cfg.get_int("num_experts_per_tok"),
            "hidden": cfg.get_int("moe_intermediate_size"),
            "activation": activation,
            "router": {"kind": "sigmoid_topk", "normalize": bool(cfg.get("norm_topk_prob")),
                       "scaling_factor": cfg.get_float("routed_scaling_factor"),
                       "n_group": cfg.get("n_group") or 1, "topk_group": cfg.get("topk_group") or 1},
            "aux_loss_coef": 0.0,  # DeepSeek-V3 balances through the selection bias, not a loss
        }
        if n_shared:
            ffn["n_shared_experts"] = n_shared
        model.setdefault("block", {})["ffn"] = ffn
        dense = min(cfg.get_int("first_k_dense_replace") or 0, cfg.get_layers("num_hidden_layers"))
        if dense:
            model.setdefault("layers", []).append({"select": 0 if dense == 1 else f"0:{dense}", "ffn": {
                "kind": "swiglu" if activation == "silu" else "geglu", "hidden": cfg.get_int("intermediate_size"),
                "activation": activation}})
        # The multi-token prediction modules are not part of the causal LM; intermediate_size only sizes dense layers.
        cfg.mark_read("num_mtp_layers", "num_nextn_predict_layers", "intermediate_size")

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        kinds = view.per_layer("ffn", "kind")
        dense = [i for i, k in enumerate(kinds) if k != "moe"]
        if dense != list(range(len(dense))) or len(dense) == len(kinds):
            raise NotExpressible("model.layers[*].ffn", f"Hugging Face {view.name} has dense layers first, then moe layers")
        moe = [layer["ffn"] for layer in view.view.layers if layer["ffn"]["kind"] == "moe"]
        strip = lambda f: {k: v for k, v in f.items() if k != "aux_loss_coef"}  # noqa: E731
        if any(strip(f) != strip(moe[0]) for f in moe[1:]):
            raise NotExpressible("model.layers[*].ffn", f"the moe layers differ; Hugging Face {view.name} has one setting")
        ffn, router = moe[0], moe[0].get("router") or {}
        if router.get("kind") != "sigmoid_topk" or router.get("bias"):
            raise NotExpressible("model.block.ffn.router", f"Hugging Face {view.name} routes with sigmoid_topk (no score bias)")
        hidden = ffn["hidden"]
        if ffn["n_shared_experts"] and (ffn.get("shared_hidden") or hidden * ffn["n_shared_experts"]) != hidden * ffn["n_shared_experts"]:
            raise NotExpressible("model.block.ffn.shared_hidden", f"Hugging Face {view.name}'s shared experts are n_shared_experts * hidden wide")
        config.update(n_routed_experts=ffn["n_experts"], num_experts_per_tok=ffn["top_k"], moe_intermediate_size=hidden,
                      n_shared_experts=ffn["n_shared_experts"], norm_topk_prob=router["normalize"],
                      routed_scaling_factor=router["scaling_factor"], n_group=router["n_group"],
                      topk_group=router["topk_group"], first_k_dense_replace=len(dense),
                      hidden_act={"silu": "silu", "gelu_tanh": "gelu_pytorch_tanh", "gelu": "gelu"}[ffn["activation"]])
        if dense:
            widths = {view.view.layers[i]["ffn"]["hidden"] for i in dense}
            if len(widths) > 1:
                raise NotExpressible("model.layers[*].ffn.hidden", f"dense layers of widths {sorted(widths)}; one intermediate_size")
            config["intermediate_size"] = widths.pop()

    def rules(self) -> list[Rule]:
        return [
            *expert_rules(saved=MLP),
            Copy(f"{MLP}.gate.e_score_correction_bias", "blocks.{i}.ffn.router.selection_bias"),
            Fused([f"{MLP}.shared_experts.gate_proj.weight", f"{MLP}.shared_experts.up_proj.weight"],
                  "blocks.{i}.ffn.shared.gate_up.weight", sizes=_shared_halves),
            Copy(f"{MLP}.shared_experts.down_proj.weight", "blocks.{i}.ffn.shared.down.weight"),
            *GatedFFN().rules(),  # the dense first layers
        ]


@dataclass(frozen=True)
class SwitchedWindows(Part):
    """use_sliding_window + sliding_window (+ layer_types where the family reads it) <-> per-layer windows.

    ``default(cfg, n_layers)`` says which layers slide when use_sliding_window is on and the
    config has no layer_types; it differs per family in transformers 5: Qwen2-MoE slides
    the even layers below max_window_layers, SmolLM3 its NoPE layers, Qwen3-MoE every layer
    (it has no layer_types: ``layer_types=False``, so every layer slides or none does).
    Layers that slide while use_sliding_window is off are refused: transformers runs them
    inconsistently (Qwen2-MoE's window becomes 0, SmolLM3's flash kernel does not slide).
    """

    default: Callable[[ConfigReader, int], list[bool]]
    layer_types: bool = True

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        n_layers = cfg.get_layers("num_hidden_layers")
        use = cfg.require("use_sliding_window", (False, True), why="it switches sliding windows on or off")
        default = [bool(use) and d for d in self.default(cfg, n_layers)]  # called either way: it reads its fields
        if self.layer_types:
            types = layer_types_from_config(cfg, ["sliding_attention" if d else "full_attention" for d in default])
            sliding = [t == "sliding_attention" for t in types]
        else:
            sliding = default
        window = cfg.get("sliding_window")  # read either way: it matters only where layers slide
        if any(sliding):
            if not use:
                raise UserError(f"{cfg.family}: layer_types names sliding_attention layers but use_sliding_window is "
                                "false, which transformers does not run consistently; set use_sliding_window: true, "
                                "or make every layer full_attention")
            window = cfg.get_size("sliding_window")
        _windowed(model, [window if s else None for s in sliding])

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        window = single_window(view.view, view.name)
        windows = view.per_layer("attention", "window")
        if not self.layer_types and window is not None and None in windows:
            raise NotExpressible("model.layers[*].attention.window",
                                 f"Hugging Face {view.name} slides every layer or none (use_sliding_window), "
                                 f"got windows {windows}")
        config.update(use_sliding_window=window is not None, sliding_window=window)
        if self.layer_types:
            config["layer_types"] = ["sliding_attention" if w is not None else "full_attention" for w in windows]


# -- the family builder --------------------------------------------------------------------------------

#: What a Llama-style decoder is made of: sizes, RoPE, pre-norm RMSNorm blocks, GQA, a gated feed-forward.
LLAMA_PARTS: tuple[Part, ...] = (Sizes(), Rope(), Layout("prenorm"), RMSNorm(), Attention(), GatedFFN())


def decoder_family(*, name: str, model_type: str, architecture: str, defaults: Mapping[str, Any],
                   parts: Sequence[Part], extra_rules: Sequence[Rule] = (), rules: Sequence[Rule] | None = None,
                   **family: Any) -> Family:
    """A :class:`Family` made of ``parts``: to_spec, to_config and the weight rules are theirs, in order.

    ``rules`` replaces the parts' weight rules (a family with its own tensor names);
    ``extra_rules`` adds to them. Other keywords are :class:`Family` fields (maps, caveats, ...).
    """
    parts = tuple(parts)

    def to_spec(cfg: ConfigReader) -> dict[str, Any]:
        model: dict[str, Any] = {}
        for part in parts:
            part.read(cfg, model)
        return model

    def to_config(view: SpecView) -> dict[str, Any]:
        asked, config = FamilyView(view, name), {}
        for part in parts:
            part.write(asked, config)
        return config

    weights = list(rules) if rules is not None else [rule for part in parts for rule in part.rules()]
    return Family(name=name, model_type=model_type, architecture=architecture, defaults=dict(defaults),
                  to_spec=to_spec, to_config=to_config, weights=weights + list(extra_rules), **family)


def per_layer_overrides(model: dict[str, Any], field: str, per_layer: list[dict[str, Any]], n_layers: int) -> None:
    """The most common of the layers' ``field`` settings into the block, the others as ``layers:`` overrides.

    The block keeps only the settings that are on (a value other than None or False); an override
    names what differs from the block, or the whole component when its kind differs.
    """
    keys = [json.dumps(d, sort_keys=True) for d in per_layer]
    counts = Counter(keys)
    base = per_layer[keys.index(max(counts, key=lambda k: (counts[k], -keys.index(k))))]
    model.setdefault("block", {}).setdefault(field, {}).update({k: v for k, v in base.items() if v not in (None, False)})
    for key in sorted(set(keys), key=keys.index):
        value = per_layer[keys.index(key)]
        if value == base:
            continue
        indices = [i for i, k in enumerate(keys) if k == key]
        change = value if value.get("kind") != base.get("kind") else {k: v for k, v in value.items() if base.get(k) != v}
        model.setdefault("layers", []).append({"select": _selection(indices, n_layers), field: change})


def replace_part(parts: Sequence[Part], new: Part, *, instead_of: type[Part] | None = None) -> tuple[Part, ...]:
    """``parts`` with the part of type ``instead_of`` (default: ``new``'s type) swapped for ``new``."""
    old = instead_of or type(new)
    if not any(type(p) is old for p in parts):
        raise ValueError(f"no {old.__name__} part to replace")
    return tuple(new if type(p) is old else p for p in parts)


__all__ = [
    "ATTN", "Attention", "EmbeddingScale", "FamilyView", "Fixed", "GATED_FFNS", "GatedFFN", "GroupedExperts", "LAYER", "LLAMA_PARTS",
    "LAYER_TYPES", "LayerNorm", "LayerTypeRopes", "LayerTypes", "Layout", "MLP", "MixtureOfExperts", "NoRopeLayers", "Part", "QKNorm", "QueryScale", "QwenWindows", "RMSNorm", "Refuse",
    "Rope", "Sizes", "SlidingRopeGlobalNope", "Switch", "SwitchedWindows", "Value", "attention_sizes", "attention_sizes_config", "check_rotary_dim",
    "decoder_family", "default_gated_hidden", "per_layer_overrides", "expert_rules", "gated_ffn", "gated_ffn_config",
    "layer_types_from_config", "model_sizes", "model_sizes_config", "no_output_bias", "no_rope_flags", "replace_part", "rmsnorm",
    "rmsnorm_config", "rope", "rope_config", "rope_parameters_of", "single_window", "window_layers",
]
