"""Positions: rotary embeddings (theta, partial rotation, each scaling) both ways, and layers or models without them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from specformer.errors import UserError

from specformer_hf.config import ConfigReader, rope_parameters
from specformer_hf.parts.attention import attention_sizes
from specformer_hf.parts.base import FamilyView, Part, selection
from specformer_hf.specview import NotExpressible, SpecView


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
                other_layers: tuple[str, ...] = (), interleaved: bool = False) -> dict[str, Any]:
    """``rope_parameters`` (transformers 5) plus the legacy fields transformers 4 reads.

    ``other_layers``: positional kinds some layers may have instead, which the family maps
    elsewhere (``none`` for NoPE layers). ``interleaved``: the family rotates adjacent pairs (Cohere)."""
    view.one_positional(family=family, except_kinds=other_layers)
    pos = view.expect(view.positional, "model.positional", ("rope",), family=family)
    params = rope_parameters_of(pos, family, path="model.positional", rope_types=rope_types, partial=partial,
                                context_length=view.model.context_length, interleaved=interleaved)
    scaling = pos.get("scaling")
    out: dict[str, Any] = {"rope_parameters": params}
    if scaling:
        out["rope_scaling"] = dict(params)  # transformers 4 reads this (5 too, and finds the same)
    elif legacy_theta:
        out[legacy_theta] = pos["theta"]
    return out


def rope_parameters_of(pos: dict[str, Any], family: str, *, path: str, context_length: int,
                       rope_types: tuple[str, ...] = ROPE_TYPES, partial: bool = False,
                       interleaved: bool = False) -> dict[str, Any]:
    """One ``rope`` scheme (full params) as transformers' rope parameters; NotExpressible (at ``path``) otherwise.

    ``interleaved``: the family rotates adjacent pairs (Cohere), and only those."""
    if pos["kind"] != "rope":
        raise NotExpressible(f"{path}.kind", f"{pos['kind']!r} has no equivalent in Hugging Face {family} (which uses 'rope')")
    if bool(pos.get("interleaved")) != interleaved:
        raise NotExpressible(f"{path}.interleaved", f"Hugging Face {family} rotates adjacent pairs (interleaved: true)"
                             if interleaved else
                             f"interleaved (GPT-J style) rotary pairs have no equivalent in Hugging Face {family}")
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


def check_rotary_dim(cfg: ConfigReader, n_heads: int, positional: dict[str, Any]) -> None:
    """transformers rotates int(head_dim * partial_rotary_factor) channels; an odd count has no pairing."""
    head_dim = cfg.get("head_dim", None) or cfg.get_size("hidden_size") // n_heads
    rotary = int(head_dim * positional.get("fraction", 1.0))
    if rotary % 2:
        raise UserError(
            f"{cfg.family}: partial_rotary_factor {positional.get('fraction')} rotates {rotary} of {head_dim} channels "
            "per head; an odd number cannot be split into rotation pairs"
        )


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
    #: The family rotates adjacent pairs (Cohere's repeat_interleave), not halves.
    interleaved: bool = False

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        if self.rotary_dim_key and cfg.get(self.rotary_dim_key, None) is not None:
            head_dim = attention_sizes(cfg)["head_dim"]
            cfg.data.setdefault("partial_rotary_factor", cfg.get_size(self.rotary_dim_key) / head_dim)
        positional = rope(cfg, rope_types=self.rope_types, extra_legacy=dict(self.extra_legacy),
                          original_override=self.original_override, partial=self.partial)
        if self.partial:
            check_rotary_dim(cfg, cfg.get_size("num_attention_heads"), positional)
        model["positional"] = {**positional, "interleaved": True} if self.interleaved else positional

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        written = rope_config(view.view, view.name, legacy_theta=self.legacy_theta, rope_types=self.rope_types,
                              partial=self.partial, other_layers=self.other_layers, interleaved=self.interleaved)
        if self.write_fraction:
            fraction = written["rope_parameters"].setdefault("partial_rotary_factor", 1.0)
            written["partial_rotary_factor"] = fraction  # where transformers 4 reads it
            if "rope_scaling" in written:
                written["rope_scaling"]["partial_rotary_factor"] = fraction
        config.update(written)


# -- layers without positions ---------------------------------------------------------------------------


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
            model.setdefault("layers", []).append({"select": selection(nope, n_layers), "positional": "none"})

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        kinds = [scheme["kind"] if scheme else view.positional["kind"] for scheme in view.per_layer("positional")]
        config["no_rope_layers"] = [int(kind != "none") for kind in kinds]



@dataclass(frozen=True)
class LayerRopeThetas(Part):
    """rope_parameters with ``layer_rope_theta`` (one rope base per layer, 0: no positions; default: the rope's theta
    on every layer) <-> a rope per layer that differs from the others in its theta only, or ``positional: none``
    (Granite SWA). The model's positional is the most common rope; other layers get overrides."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        base = rope(cfg)
        n_layers = cfg.get_layers("num_hidden_layers")
        thetas = cfg.get("layer_rope_theta", None)
        if thetas is None:
            thetas = [base["theta"]] * n_layers
        if (not isinstance(thetas, list) or len(thetas) != n_layers
                or any(isinstance(t, bool) or not isinstance(t, (int, float)) or t < 0 for t in thetas)):
            raise UserError(f"{cfg.family}: layer_rope_theta must hold a rope base >= 0 (0: no positions) for each of "
                            f"the {n_layers} layers, got {thetas!r}")
        schemes = [{**base, "theta": float(t)} if t else {"kind": "none"} for t in thetas]
        ropes = [s for s in schemes if s["kind"] == "rope"]
        # The most common rope is the model's (ties: the first layer's); with no rope at all, none.
        model["positional"] = max(ropes, key=ropes.count) if ropes else {"kind": "none"}
        for scheme in [s for i, s in enumerate(schemes) if s not in schemes[:i]]:
            if scheme != model["positional"]:
                indices = [i for i, s in enumerate(schemes) if s == scheme]
                model.setdefault("layers", []).append({"select": selection(indices, n_layers),
                                                       "positional": "none" if scheme["kind"] == "none" else scheme})

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        schemes = [scheme or view.positional for scheme in view.per_layer("positional")]
        ropes = [(i, s) for i, s in enumerate(schemes) if s["kind"] != "none"]
        for i, scheme in ropes:
            if scheme["kind"] != "rope":
                raise NotExpressible(f"model.layers[{i}].positional", f"{scheme['kind']!r} has no equivalent in Hugging "
                                     f"Face {view.name} (rope, or none through a layer_rope_theta of 0)")
        first = view.positional if view.positional["kind"] == "rope" else (ropes[0][1] if ropes else None)
        for i, scheme in ropes:
            if {**scheme, "theta": 0} != {**first, "theta": 0}:
                raise NotExpressible(f"model.layers[{i}].positional", f"differs from model.positional in more than "
                                     f"its theta; Hugging Face {view.name}'s layers share one rope but for its base")
        params = (rope_parameters_of(first, view.name, path="model.positional", context_length=view.model.context_length)
                  if first else {"rope_type": "default", "rope_theta": 10000.0})
        config.update(rope_parameters=params,
                      layer_rope_theta=[s["theta"] if s["kind"] == "rope" else 0 for s in schemes])

# -- no positions ---------------------------------------------------------------------------------------


def no_positions(view: FamilyView) -> None:
    """Families whose layers read no positions: ``positional: none`` everywhere."""
    if view.positional["kind"] != "none" or any(p is not None and p["kind"] != "none" for p in view.per_layer("positional")):
        raise NotExpressible("model.positional.kind", f"Hugging Face {view.name} has no positions (positional: none)")


# -- ropes of the hybrid families -----------------------------------------------------------------------


@dataclass(frozen=True)
class TextRope(Rope):
    """Qwen3.5's rope, read as the text-only model uses it: the multimodal sections (mrope_section,
    mrope_interleaved) turn text positions exactly as a plain rope does, so they are read and dropped."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        stored = cfg.data.get("rope_parameters")
        if isinstance(stored, dict) and ({"mrope_section", "mrope_interleaved"} & stored.keys()):
            cfg.data["rope_parameters"] = {k: v for k, v in stored.items() if k not in ("mrope_section", "mrope_interleaved")}
        cfg.mark_read("mrope_section", "mrope_interleaved")
        super().read(cfg, model)


@dataclass(frozen=True)
class OptionalRope(Rope):
    """OLMo Hybrid: rope on the attention layers, or none at all when rope_theta is null (its released checkpoints)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        stored = cfg.data.get("rope_parameters")
        theta = stored.get("rope_theta", 0) if isinstance(stored, dict) else cfg.data.get("rope_theta", 0)
        if theta is None:
            cfg.mark_read("rope_parameters", "rope_theta", "rope_scaling")
            model["positional"] = {"kind": "none"}
            return
        super().read(cfg, model)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        if view.positional["kind"] == "none":
            view.view.one_positional(family=view.name)
            config["rope_parameters"] = {"rope_type": "default", "rope_theta": None}
            return
        super().write(view, config)


__all__ = [
    "LayerRopeThetas", "NoRopeLayers", "OptionalRope", "ROPE_SCALINGS", "ROPE_TYPES", "Rope", "TextRope", "check_rotary_dim", "no_positions",
    "no_rope_flags", "rope", "rope_config", "rope_parameters_of",
]
