"""Which layers attend through a sliding window: layer_types, sliding_window and each family's switches for them,
and the per-layer ropes that go with the layer types (Gemma 3, OLMo 3, Cohere2, EXAONE 4)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from specformer.errors import UserError

from specformer_hf.config import ConfigReader
from specformer_hf.parts.base import FamilyView, Part, selection
from specformer_hf.parts.positions import check_rotary_dim, rope, rope_parameters_of
from specformer_hf.specview import NotExpressible, SpecView


def window_layers(base_window: int | None, windows: list[int | None]) -> list[dict[str, Any]]:
    """Per-layer overrides giving layer i ``windows[i]`` when the block's window is ``base_window``."""
    overrides = []
    for window in sorted({w for w in windows if w != base_window}, key=lambda w: (w is None, w or 0)):
        indices = [i for i, w in enumerate(windows) if w == window]
        overrides.append({"select": selection(indices, len(windows)), "mixer": {"window": window}})
    return overrides


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
    windows = {w for w in view.per_layer("mixer", "window") if w is not None}
    if len(windows) > 1:
        raise NotExpressible("model.layers[*].mixer.window", f"several window sizes {sorted(windows)}; Hugging Face {family} has one sliding_window")
    return windows.pop() if windows else None


# -- parts ------------------------------------------------------------------------------------------------


def windowed(model: dict[str, Any], windows: list[int | None]) -> None:
    """The block's window is the most common one; the other layers get overrides."""
    base = max(set(windows), key=lambda w: (windows.count(w), w is None))
    model.setdefault("block", {}).setdefault("mixer", {})["window"] = base
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
        windowed(model, [window if t == "sliding_attention" else None for t in types])

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        window = single_window(view.view, view.name)
        if window is None and self.required:
            raise NotExpressible("model.layers[*].mixer.window", f"Hugging Face {view.name} needs sliding-window layers (sliding_window)")
        config["sliding_window"] = window
        config["layer_types"] = ["sliding_attention" if w is not None else "full_attention"
                                 for w in view.per_layer("mixer", "window")]


LAYER_TYPES = ("sliding_attention", "full_attention")


def check_layer_type(cfg: ConfigReader, layer_type: Any) -> None:
    if layer_type not in LAYER_TYPES:
        raise UserError(f"{cfg.family}: layer type {layer_type!r} is not supported; supported: {', '.join(LAYER_TYPES)}")


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
    #: The family rotates part of each head where a layer type's partial_rotary_factor says (MiMo-V2-Flash).
    partial: bool = False

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
        windowed(model, [window if t == "sliding_attention" else None for t in types])
        schemes = {t: self._rope(cfg, t) for t in LAYER_TYPES}
        base = max(LAYER_TYPES, key=types.count)  # the scheme of most layers is the model's
        model["positional"] = schemes[base]
        other = [i for i, t in enumerate(types) if t != base]
        if other and schemes[base] != schemes[types[other[0]]]:
            model.setdefault("layers", []).append({"select": selection(other, n_layers), "positional": schemes[types[other[0]]]})

    def layer_change(self, cfg: ConfigReader, model: dict[str, Any], layer_type: str) -> dict[str, Any]:
        """A layer of ``layer_type`` outside layer_types (an MTP layer) as block changes: its window and its type's
        rope (where not model.positional), as :meth:`read` gives the main layers of that type."""
        check_layer_type(cfg, layer_type)
        change: dict[str, Any] = {"mixer": {"window": cfg.get("sliding_window") if layer_type == "sliding_attention" else None}}
        scheme = self._rope(cfg, layer_type)
        if scheme != model["positional"]:
            change["positional"] = scheme
        return change

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
        scheme = rope(single, partial=self.partial)
        cfg.unused.extend(single.unused)
        if self.partial:
            check_rotary_dim(cfg, cfg.get_size("num_attention_heads"), scheme)
        return scheme

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        windows = view.per_layer("mixer", "window")
        sliding = {w for w in windows if w is not None}
        if len(sliding) > 1:
            raise NotExpressible("model.layers[*].mixer.window", f"several window sizes {sorted(sliding)}; Hugging Face {view.name} has one sliding_window")
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
                                                        context_length=view.model.context_length, partial=self.partial)
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
            windowed(model, [None] * n_layers)
            return
        windowed(model, [window if t == "sliding_attention" else None for t in types])
        full = [i for i, t in enumerate(types) if t == "full_attention"]
        if full:
            model.setdefault("layers", []).append({"select": selection(full, n_layers), "positional": "none"})

    def layer_change(self, cfg: ConfigReader, model: dict[str, Any], layer_type: str) -> dict[str, Any]:
        """A layer of ``layer_type`` outside layer_types (an MTP layer) as block changes: the window and rope of a
        sliding layer, no window and ``positional: none`` on a global one (the rope where no layer has a window)."""
        check_layer_type(cfg, layer_type)
        window = cfg.get("sliding_window")
        if self.rope_without_window and window is None:
            if layer_type == "sliding_attention":
                raise UserError(f"{cfg.family}: a sliding_attention MTP layer needs sliding_window, which is null")
            return {"mixer": {"window": None}}
        if layer_type == "sliding_attention":
            return {"mixer": {"window": window}}
        return {"mixer": {"window": None}, "positional": "none"}

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        windows = view.per_layer("mixer", "window")
        sliding = {w for w in windows if w is not None}
        schemes = [scheme or view.positional for scheme in view.per_layer("positional")]
        everywhere = self.rope_without_window and not sliding and all(s == view.positional for s in schemes)
        if len(sliding) != 1 and not everywhere:
            raise NotExpressible("model.layers[*].mixer.window", f"Hugging Face {view.name} has one sliding_window "
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
    """use_sliding_window, sliding_window, max_window_layers (transformers 4) and layer_types <-> per-layer windows.

    ``switch``: the boolean field that turns windows on; None where the family has none and a non-null
    sliding_window is on by itself (dots.llm1).
    """

    switch: str | None = "use_sliding_window"

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        window = cfg.get("sliding_window")  # read either way: it matters only with use_sliding_window
        window = window if self.switch is None or cfg.get(self.switch) else None
        n_layers, first_sliding = cfg.get_layers("num_hidden_layers"), cfg.get_int("max_window_layers")
        default = ["sliding_attention" if window is not None and i >= first_sliding else "full_attention" for i in range(n_layers)]
        types = layer_types_from_config(cfg, default)
        if window is None and "sliding_attention" in types:  # transformers cannot build their mask either
            why = f"{self.switch} false or sliding_window null" if self.switch else "sliding_window null"
            raise UserError(f"{cfg.family}: layer_types names sliding_attention layers but there is no window "
                            f"({why}); set {'both' if self.switch else 'it'}, or make every layer full_attention")
        windowed(model, [window if t == "sliding_attention" else None for t in types])

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        window = single_window(view.view, view.name)
        types = ["sliding_attention" if w is not None else "full_attention" for w in view.per_layer("mixer", "window")]
        sliding = [i for i, t in enumerate(types) if t == "sliding_attention"]
        # max_window_layers is what transformers 4 reads; it only describes "every layer from k on".
        first = sliding[0] if sliding and sliding == list(range(sliding[0], len(types))) else len(types)
        config.update(sliding_window=window, max_window_layers=first, layer_types=types)
        if self.switch is not None:
            config[self.switch] = window is not None


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
        windowed(model, [window if s else None for s in sliding])

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        window = single_window(view.view, view.name)
        windows = view.per_layer("mixer", "window")
        if not self.layer_types and window is not None and None in windows:
            raise NotExpressible("model.layers[*].mixer.window",
                                 f"Hugging Face {view.name} slides every layer or none (use_sliding_window), "
                                 f"got windows {windows}")
        config.update(use_sliding_window=window is not None, sliding_window=window)
        if self.layer_types:
            config["layer_types"] = ["sliding_attention" if w is not None else "full_attention" for w in windows]


__all__ = [
    "LAYER_TYPES", "LayerTypeRopes", "LayerTypes", "QwenWindows", "SlidingRopeGlobalNope", "SwitchedWindows",
    "layer_types_from_config", "single_window", "window_layers", "windowed",
]
