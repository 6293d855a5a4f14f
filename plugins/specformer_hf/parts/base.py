"""What every part shares: the :class:`Part` protocol, the family's view of a spec, and how parts write layers.

A family is a list of parts (see :mod:`specformer_hf.parts.decoder`), each stating one mapping
in both directions -- which ``config.json`` fields become which spec fields, and back --
together with the checkpoint tensors it accounts for. This module holds the protocol, the
parts that copy single fields (:class:`Switch`, :class:`Value`, :class:`Fixed`,
:class:`Refuse`), and the helpers a part uses to write per-layer settings (``layers:``
overrides with readable selections) and to tell layers of several kinds apart.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from specformer.errors import UserError
from specformer.model.attention import cache_slots_of
from specformer.model.state import state_slots_of

from specformer_hf.config import ConfigReader
from specformer_hf.rules import Rule
from specformer_hf.specview import NotExpressible, SpecView


#: Where a Llama-style checkpoint keeps layer i.
LAYER = "model.layers.{i}"
#: Our name of layer ``{i}``'s token mixer (``blocks.{i}.mixer.qkv.weight``): every rule names its tensors from here.
BLOCK_MIXER = "blocks.{i}.mixer"
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
        """A spec value by path: ``"mixer.window"`` (the same in every layer) or a model field (``"logit_softcap"``)."""
        if "." in path:
            field_name, key = path.split(".", 1)
            return self.uniform(field_name, key)
        return getattr(self.model, path)


def set_path(model: dict[str, Any], path: str, value: Any) -> None:
    """Set ``"mixer.window"`` in the block (creating the component dict) or a model field."""
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
class Switch(Part):
    """A boolean config field that sets one or more spec fields alike (attention_bias -> qkv_bias and out_bias)."""

    key: str
    paths: tuple[str, ...]

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        value = bool(cfg.get(self.key))
        for path in self.paths:
            set_path(model, path, value)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        config[self.key] = view.get(self.paths[0])  # the read-back check refuses specs where the paths differ


@dataclass(frozen=True)
class Value(Part):
    """A config field copied as is to a spec field (sliding_window -> mixer.window)."""

    key: str
    path: str

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        set_path(model, self.path, cfg.get(self.key))

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        config[self.key] = view.get(self.path)


@dataclass(frozen=True)
class Fixed(Part):
    """A spec field the family always has at one value (Qwen2's q/k/v biases); ``why`` says so on export."""

    path: str
    value: Any
    why: str

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        set_path(model, self.path, self.value)

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
class SavedNames(Part):
    """Fields a config.json may hold under another name (transformers' attribute_map), read under the names the parts
    use: ``pairs`` of (the other name, the parts' name). Both set to different values is refused, as transformers
    keeps one field. Export writes the parts' names (a family that saves the others renames them in a last part)."""

    pairs: tuple[tuple[str, str], ...]

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        for saved, name in self.pairs:
            if not cfg.has(saved):
                continue
            if cfg.has(name) and cfg.data[name] != cfg.data[saved]:
                raise UserError(f"{cfg.family}: config.json sets both {saved!r} ({cfg.data[saved]!r}) and {name!r} "
                                f"({cfg.data[name]!r}), which transformers treats as one field")
            cfg.data[name] = cfg.data[saved]
            cfg.mark_read(saved)


# -- per-layer settings --------------------------------------------------------------------------------


def selection(indices: list[int], n_layers: int) -> Any:
    """A readable selection: an index, a slice such as '0::2' or '1:5', else the list."""
    if len(indices) == 1:
        return indices[0]
    step = indices[1] - indices[0]
    suffix = f":{step}" if step != 1 else ""
    for text in (f"{indices[0]}:{suffix}" if suffix else f"{indices[0]}:", f"{indices[0]}:{indices[-1] + 1}{suffix}"):
        if list(range(n_layers))[slice(*[int(p) if p else None for p in text.split(":")])] == indices:
            return text
    return indices


def layers_of_two_kinds(model: dict[str, Any], kinds: list[str], parts: dict[str, dict[str, Any]]) -> None:
    """A hybrid's two kinds of layer (``kinds``: each layer's, keys of ``parts``): the block takes the block
    fields ``parts[k]`` of the more common kind (the first of ``parts`` on a tie), one ``layers:`` override
    those of the other."""
    base = max((kind for kind in parts if kind in kinds), key=kinds.count)  # a kind no layer has needs no parts
    model.setdefault("block", {}).update(parts[base])
    other = [i for i, kind in enumerate(kinds) if kind != base]
    if other:
        model.setdefault("layers", []).append({"select": selection(other, len(kinds)), **parts[kinds[other[0]]]})


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
        model.setdefault("layers", []).append({"select": selection(indices, n_layers), field: change})


# -- layers of several kinds ---------------------------------------------------------------------------


def uniform_mixers(mixers: list[dict[str, Any]], *, family: str, what: str) -> dict[str, Any]:
    """The one setting every layer's ``what`` mixer has (a Hugging Face config holds one)."""
    first = mixers[0]
    for other in mixers[1:]:
        if other != first:
            raise NotExpressible("model.layers[*].mixer", f"the {what} layers differ; Hugging Face {family} "
                                 f"has one {what} setting for all of them")
    return first


def keeps_state(mixer: Any) -> bool:
    """A recurrent mixer (Mamba-2): it declares a state per sequence."""
    return state_slots_of(mixer) is not None


def keeps_keys(mixer: Any) -> bool:
    """Softmax attention: it keeps keys per token."""
    return cache_slots_of(mixer) is not None


# -- config numbers that read back exactly -------------------------------------------------------------


def exact_preimage(target: float, forward: Callable[[float], float], guess: float) -> float:
    """A config value ``v`` near ``guess`` with ``forward(v) == target`` exactly; ``guess`` when there is none.

    A spec value computed from a config value (``logit_scale = 1 / logits_scaling``) must
    come back unchanged after export and import. Division does not always invert a
    division in floating point, so the neighbours of ``guess`` are tried too, a few units
    in the last place either side. A spec value that was itself read from a config always
    has one; a value written by hand may fall between two that the formula reaches, and
    then comes back within a unit in the last place (the export's read-back allows that).
    """
    candidates = [guess]
    below = above = guess
    for _ in range(8):
        below, above = math.nextafter(below, -math.inf), math.nextafter(above, math.inf)
        candidates += [below, above]
    return next((value for value in candidates if forward(value) == target), guess)


__all__ = [
    "ATTN", "FamilyView", "Fixed", "LAYER", "MLP", "Part", "Refuse", "SavedNames", "Switch", "Value", "exact_preimage", "keeps_keys",
    "keeps_state", "layers_of_two_kinds", "per_layer_overrides", "selection", "set_path", "uniform_mixers",
]
