"""A Hugging Face model family, and the registry of families filled through a hook.

A :class:`Family` is data plus two small functions: the defaults of the transformers
config class, ``to_spec`` (config -> the spec's ``model`` section), ``to_config``
(spec -> config fields) and the weight :mod:`rules <specformer_hf.rules>`. Import and
export are generic code driven by it (:mod:`specformer_hf.importer`,
:mod:`specformer_hf.exporter`), so a family module reads as a table.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Mapping, Sequence

from specformer.errors import RegistryError, UserError
from specformer.registry.discovery import get_plugin_manager

from specformer_hf.config import ConfigReader
from specformer_hf.coverage import refusal
from specformer_hf.rules import LAYERS, Rule
from specformer_hf.specview import SpecView


#: The entry-point name of this plugin, whose families come first.
BUILTIN_PLUGIN = "hf"


@dataclass(frozen=True)
class Family:
    """How one Hugging Face ``model_type`` maps onto a specformer spec and Decoder.

    ``to_spec(config)`` returns the spec's ``model`` section from a
    :class:`~specformer_hf.config.ConfigReader`, raising
    :class:`~specformer.errors.UserError` for values it cannot reproduce.
    ``to_config(view)`` returns the ``config.json`` fields for a
    :class:`~specformer_hf.specview.SpecView`, raising
    :class:`~specformer_hf.specview.NotExpressible` for a part with no equivalent;
    export double-checks it by reading the result back with ``to_spec``.
    """

    name: str
    model_type: str
    architecture: str
    defaults: Mapping[str, Any]
    to_spec: Callable[[ConfigReader], dict[str, Any]]
    to_config: Callable[[SpecView], dict[str, Any]]
    weights: Sequence[Rule]
    #: Checkpoint tensor names (regular expressions, full match) that hold no weights (old buffers).
    ignore_tensors: tuple[str, ...] = ()
    #: (prefix, replacement) tried when a tensor is absent, e.g. ("transformer.", "") for base-model files.
    aliases: tuple[tuple[str, str], ...] = ()
    #: The untied LM head's tensor; when the config ties embeddings and the file has it anyway, it must equal them.
    head_tensor: str = "lm_head.weight"
    #: Where the checkpoint keeps each multi-token prediction depth's decoder layer: after the last one
    #: (DeepSeek-V3's, ``{i}`` = num_hidden_layers + depth) or under a name of its own (``{d}`` = the depth).
    mtp_layer: str = LAYERS
    #: Config fields this family knows do not change the maths (beyond config.NON_MATH_FIELDS).
    non_math_fields: tuple[str, ...] = ()
    #: One line each, for the docs table: what maps, and what does not.
    maps: str = ""
    caveats: str = ""
    plugin: str = "?"


@dataclass
class Families:
    """Every family known to this process, by ``model_type``, in the order they were added."""

    _by_type: dict[str, Family] = field(default_factory=dict)
    _plugin: str = "?"

    def add(self, family: Family) -> None:
        if not isinstance(family, Family):
            raise RegistryError(f"plugin {self._plugin!r} adds {family!r}, which is not a specformer_hf.Family")
        existing = self._by_type.get(family.model_type)
        if existing is not None:
            raise RegistryError(
                f"plugin {self._plugin!r} adds a family for model_type {family.model_type!r}, "
                f"already added by plugin {existing.plugin!r}"
            )
        if family.plugin == "?":
            family = _with_plugin(family, self._plugin)
        self._by_type[family.model_type] = family

    def get(self, model_type: str) -> Family:
        """The family of ``model_type``; a UserError listing the known ones (and the closest) otherwise."""
        if model_type in self._by_type:
            return self._by_type[model_type]
        known = sorted(self._by_type)
        # A model type transformers has but specformer does not convert: say what it lacks, not only what exists.
        why = refusal(str(model_type), supported=known)
        if why is not None:
            raise UserError(why)
        close = difflib.get_close_matches(str(model_type), known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UserError(
            f"unknown Hugging Face model_type {model_type!r}{hint}; supported: {', '.join(known)}. "
            "A plugin can add a family through the specformer_hf_register_families hook."
        )

    def by_name(self, name: str) -> Family:
        """A family by its ``model_type`` or display name (case-insensitive)."""
        for family in self:
            if name == family.model_type or name.lower() == family.name.lower():
                return family
        return self.get(name)

    def __iter__(self) -> Iterator[Family]:
        # The built-in families first, so automatic export choices do not depend on what else is installed.
        builtin = [f for f in self._by_type.values() if f.plugin == BUILTIN_PLUGIN]
        return iter(builtin + [f for f in self._by_type.values() if f.plugin != BUILTIN_PLUGIN])

    def __len__(self) -> int:
        return len(self._by_type)

    def model_types(self) -> list[str]:
        return [f.model_type for f in self]


def _with_plugin(family: Family, plugin: str) -> Family:
    return replace(family, plugin=plugin)


def get_families(pm: Any = None) -> Families:
    """Ask every plugin for its families (the hf plugin declared the hook when it was registered)."""
    pm = pm or get_plugin_manager()
    caller = pm.hook.specformer_hf_register_families
    families = Families()
    # The built-in families first (a plugin cannot take over their model_types), then in registration order.
    for impl in sorted(caller.get_hookimpls(), key=lambda impl: impl.plugin_name != BUILTIN_PLUGIN):
        families._plugin = impl.plugin_name
        impl.function(families=families)
    families._plugin = "?"
    return families


__all__ = ["Families", "Family", "get_families"]
