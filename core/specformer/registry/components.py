"""The component registry: kind -> name -> :class:`Component`.

A component is a factory plus the pydantic ``Params`` model that describes its
settings. Plugins add components in their ``specformer_register_components`` hook;
the builder looks them up by the ``kind`` a spec names and calls
``factory(params, **sizes)`` with the sizes that kind promises (see :data:`KINDS`).

Registration is checked when it happens, so a plugin author hears about a mistake
(a Params model that accepts unknown keys, a factory that cannot take the sizes of
its kind, a name already taken) with the plugin's name attached, not later from
deep inside a build.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator

from pydantic import BaseModel, ValidationError

from specformer.errors import RegistryError, UnknownComponentError
from specformer.messages import unknown_message
from specformer.model.sized import Sized
from specformer.renamed import current_kind, sizes_for


@dataclass(frozen=True)
class Kind:
    """A family of interchangeable components and the sizes the builder passes to each."""

    name: str
    doc: str
    sizes: tuple[str, ...] = ()


#: The kinds the core wires into a Decoder, and only those. Plugins add kinds of their own
#: in their ``specformer_add_kinds`` hook (the generate plugin's ``sampler``, for one).
KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind(
            "positional",
            "How token positions enter the model: added to the embeddings or applied inside attention.",
            ("d_model", "n_heads", "head_dim", "context_length"),
        ),
        Kind("norm", "A normalisation layer over the last dimension.", ("dim",)),
        Kind(
            "ffn",
            "The position-wise feed-forward sublayer of a block (vocab_size: for routing by token id).",
            ("d_model", "layer_index", "n_layers", "vocab_size"),
        ),
        Kind(
            "mixer",
            "The token mixer of a block: what reads the other tokens (causal self-attention, a recurrence, a "
            "convolution, or none).",
            ("d_model", "layer_index", "n_layers", "context_length"),
        ),
        Kind(
            "layout",
            "How a block wires its norms, token mixer and feed-forward around the residual stream.",
            ("d_model", "mixer", "ffn", "make_norm", "make_residual", "layer_index", "n_layers", "per_layer_input"),
        ),
        Kind(
            "residual",
            "The residual stream the blocks read and write: one stream, or several mixed by learned weights "
            "(expanded from the embeddings, collapsed before the final norm).",
            ("d_model",),
        ),
        Kind(
            "per_layer_input",
            "Inputs for every block computed once per forward from the tokens (per-layer embeddings).",
            ("vocab_size", "d_model", "n_layers"),
        ),
    )
}


@dataclass(frozen=True)
class Component:
    """One registered component: what it is, how to build it, and where it came from.

    The factory may be given as ``"package.module:Name"`` (``factory_ref``): it is imported
    the first time the component is built (or its :attr:`factory` or :attr:`source` is
    read), so that listing components, their params and their docs never imports torch.
    """

    kind: str
    name: str
    factory_ref: "Callable[..., Any] | str"
    params: type[BaseModel]
    plugin: str
    doc: str
    paper: str | None = None

    @functools.cached_property
    def factory(self) -> Callable[..., Any]:
        """The callable that builds the component (imported on first use if it was registered by path)."""
        if isinstance(self.factory_ref, str):
            return _import_factory(self.factory_ref, where=f"plugin {self.plugin!r}, {self.kind} {self.name!r}")
        return self.factory_ref

    @property
    def factory_path(self) -> str:
        """``module:qualname`` of the factory, without importing it."""
        if isinstance(self.factory_ref, str):
            return self.factory_ref
        target = _component_object(self.factory_ref)
        return f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', '?')}"

    @property
    def source(self) -> str:
        """``module (file:line)`` of the component's definition (imports a factory registered by path)."""
        return _source_of(self.factory)

    def make(self, params: BaseModel, **sizes: Any) -> Any:
        """Build from validated ``params`` and the sizes of its kind (only those the factory names are passed)."""
        return construct(self.factory, params, **sizes)

    def sized(self, params: BaseModel, **sizes: Any) -> Sized:
        """The size check: ``params.sized(**sizes)`` (see :mod:`specformer.model.sized`), never importing torch.

        Sizes may hold the checks of sibling parts (a layout's ``mixer`` is a
        :class:`Sized`). A component whose params declare no check is built on the meta
        device instead, and the facts are read from its module.
        """
        check = getattr(params, "sized", None)
        result = call_with_sizes(check, **sizes) if callable(check) else NotImplemented
        if result is NotImplemented:
            return self._built_on_meta(params, sizes, facts=True)
        if not isinstance(result, Sized):
            raise RegistryError(f"plugin {self.plugin!r}, {self.kind} {self.name!r}: {type(params).__name__}.sized "
                                f"returned {type(result).__name__}, not a Sized")
        return replace(result, name=result.name or self.class_name,
                       build=lambda: self._built_on_meta(params, sizes, facts=False))

    def _built_on_meta(self, params: BaseModel, sizes: dict[str, Any], *, facts: bool) -> Any:
        from specformer.model.sized_by_building import sized_by_building  # late: imports torch

        return sized_by_building(self, params, sizes, facts=facts)

    @property
    def class_name(self) -> str:
        """The name of the factory's class (``GatedDeltaNet``), without importing it."""
        return self.factory_path.rpartition(":")[2].rpartition(".")[2]

    @property
    def summary(self) -> str:
        """The first line of the component's documentation."""
        return self.doc.strip().splitlines()[0] if self.doc.strip() else ""

    def defaults(self) -> dict[str, Any]:
        """Each param's default, or ``...`` where the param is required."""
        out: dict[str, Any] = {}
        for name, info in self.params.model_fields.items():
            out[name] = ... if info.is_required() else info.get_default(call_default_factory=True)
        return out


def construct(factory: Callable[..., Any], params: Any, **sizes: Any) -> Any:
    """``factory(params, **sizes)``, passing only the sizes the factory names (all, if it takes ``**``).

    Every kind's builder passes all the sizes of that kind; a component names the ones it needs.
    """
    accepted = _keyword_names(factory)
    sizes = sizes_for(sizes, accepted, where=_named(factory))
    return factory(params, **{k: v for k, v in sizes.items() if accepted is None or k in accepted})


def call_with_sizes(function: Callable[..., Any], **sizes: Any) -> Any:
    """``function(**sizes)``, passing only the sizes it names (all, if it takes ``**``): a size check's call."""
    accepted = _keyword_names(function)
    sizes = sizes_for(sizes, accepted, where=_named(function))
    return function(**{k: v for k, v in sizes.items() if accepted is None or k in accepted})


def _named(function: Callable[..., Any]) -> str:
    """``module:qualname`` of a factory or check, for a message."""
    return f"{getattr(function, '__module__', '?')}:{getattr(function, '__qualname__', repr(function))}"


def _keyword_names(factory: Callable[..., Any]) -> set[str] | None:
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return {p.name for p in parameters if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)}


def _import_factory(path: str, *, where: str) -> Callable[..., Any]:
    module_name, _, qualname = path.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise RegistryError(f"{where}: factory {path!r} cannot be imported: {exc}") from exc
    if not callable(target):
        raise RegistryError(f"{where}: factory {path!r} is not callable")
    return target


@dataclass
class Resolved:
    """A component chosen by a spec, with its validated params: ``make(**sizes)`` builds it."""

    component: Component
    params: BaseModel

    def make(self, **sizes: Any) -> Any:
        return self.component.make(self.params, **sizes)

    def sized(self, **sizes: Any) -> Sized:
        """The size check of ``make(**sizes)``, without building (:meth:`Component.sized`)."""
        return self.component.sized(self.params, **sizes)

    def to_dict(self) -> dict[str, Any]:
        """The spec form: ``{"kind": name, **params}``, nested components included."""
        return {"kind": self.component.name, **self.params.model_dump(mode="json")}


@dataclass
class Registry:
    """Every registered component, by kind and name."""

    kinds: dict[str, Kind] = field(default_factory=lambda: dict(KINDS))
    _components: dict[str, dict[str, Component]] = field(default_factory=dict)
    sections: dict[str, tuple[type[BaseModel], str]] = field(default_factory=dict)

    # -- registration ---------------------------------------------------------------

    def for_plugin(self, plugin: str) -> "PluginRegistry":
        """A view that stamps every registration with ``plugin``."""
        return PluginRegistry(self, plugin)

    def add_kind(self, name: str, *, doc: str, sizes: tuple[str, ...] = (), plugin: str = "?") -> None:
        if name in self.kinds and self.kinds[name] != Kind(name, doc, tuple(sizes)):
            raise RegistryError(f"plugin {plugin!r} redefines kind {name!r}, already defined differently")
        self.kinds[name] = Kind(name, doc, tuple(sizes))

    def add_section(self, name: str, model: type[BaseModel], *, plugin: str = "?") -> None:
        """Let specs carry a top-level section ``name`` validated by ``model`` (e.g. ``train``)."""
        if name == "model":
            raise RegistryError(f"plugin {plugin!r} cannot register the section 'model': the core owns it")
        if name in self.sections and self.sections[name][0] is not model:
            raise RegistryError(
                f"plugin {plugin!r} registers spec section {name!r}, already registered by plugin "
                f"{self.sections[name][1]!r}"
            )
        _check_params_model(model, where=f"plugin {plugin!r}, section {name!r}")
        self.sections[name] = (model, plugin)

    def register(
        self,
        kind: str,
        name: str,
        *,
        factory: "Callable[..., Any] | str",
        params: type[BaseModel],
        plugin: str = "?",
        doc: str | None = None,
        paper: str | None = None,
    ) -> Component:
        """Add a component; raise :class:`RegistryError` naming the plugin if anything is off.

        ``factory`` is a callable, or ``"module:Name"`` to import it only when first built
        (the factory's signature is then checked at that point by the registry's contract
        test, not here). ``doc`` defaults to the factory's docstring, or for a factory given
        by path to the ``params`` model's.
        """
        kind = current_kind(kind, where=f"plugin {plugin!r} registering {name!r}")  # a plugin written before a rename
        where = f"plugin {plugin!r}, {kind} {name!r}"
        if kind not in self.kinds:
            raise RegistryError(f"{where}: {unknown_message('kind', kind, sorted(self.kinds), accepted='known kinds')}")
        if not name or not name.replace("_", "").replace("-", "").isalnum():
            raise RegistryError(f"{where}: a name must be letters, digits, '_' or '-'")
        existing = self._components.get(kind, {}).get(name)
        if existing is not None:
            raise RegistryError(
                f"{where}: the name is already registered by plugin {existing.plugin!r} ({existing.factory_path})"
            )
        _check_params_model(params, where=where)
        if isinstance(factory, str):
            if not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*", factory):
                raise RegistryError(f"{where}: factory {factory!r} must be a callable or 'package.module:Name'")
            own_doc = params.__doc__ if "__doc__" in vars(params) else None
        else:
            _check_factory(factory, params, self.kinds[kind], where=where)
            own_doc = getattr(factory, "__doc__", None) or getattr(getattr(factory, "__self__", None), "__doc__", None)
        component = Component(
            kind=kind,
            name=name,
            factory_ref=factory,
            params=params,
            plugin=plugin,
            doc=inspect.cleandoc(doc or own_doc or ""),
            paper=paper,
        )
        self._components.setdefault(kind, {})[name] = component
        return component

    # -- lookup ---------------------------------------------------------------------

    def get(self, kind: str, name: str) -> Component:
        """The component ``name`` of ``kind``; an unknown name lists what exists and the closest match."""
        if kind not in self.kinds:
            raise UnknownComponentError(unknown_message("kind", kind, sorted(self.kinds), accepted="known kinds"))
        by_name = self._components.get(kind, {})
        if name not in by_name:
            elsewhere = sorted(k for k, named in self._components.items() if name in named)
            raise UnknownComponentError(unknown_name_message(kind, name, sorted(by_name), other_kinds=elsewhere))
        return by_name[name]

    def names(self, kind: str) -> list[str]:
        return sorted(self._components.get(kind, {}))

    def __iter__(self) -> Iterator[Component]:
        for kind in sorted(self._components):
            for name in sorted(self._components[kind]):
                yield self._components[kind][name]

    def __len__(self) -> int:
        return sum(len(v) for v in self._components.values())

    def resolve(self, kind: str, ref: dict[str, Any], *, context: dict[str, Any] | None = None) -> Resolved:
        """Validate ``{"kind": name, **params}`` against the component's Params model.

        Raises :class:`UnknownComponentError` or pydantic's ``ValidationError``.
        """
        params = dict(ref)
        name = params.pop("kind")
        component = self.get(kind, name)
        validated = component.params.model_validate(params, context={"registry": self, **(context or {})})
        return Resolved(component, validated)


@dataclass
class PluginRegistry:
    """The registry as one plugin sees it: registrations carry the plugin's name."""

    registry: Registry
    plugin: str

    def register(self, kind: str, name: str, **kwargs: Any) -> Component:
        return self.registry.register(kind, name, plugin=self.plugin, **kwargs)

    def add_kind(self, name: str, *, doc: str, sizes: tuple[str, ...] = ()) -> None:
        self.registry.add_kind(name, doc=doc, sizes=sizes, plugin=self.plugin)

    def add_section(self, name: str, model: type[BaseModel]) -> None:
        self.registry.add_section(name, model, plugin=self.plugin)


def unknown_name_message(kind: str, name: str, available: list[str], *, other_kinds: list[str] = ()) -> str:
    """Why ``name`` is not a ``kind``: a name of another kind says which; otherwise the closest name.

    ``'swiglu' is an ffn, not a norm; registered norm components: ...`` or
    ``unknown norm 'rmsnrom'; did you mean 'rmsnorm'? registered norm components: ...``.
    """
    accepted = f"registered {kind} components"
    if other_kinds:
        listing = ", ".join(available) if available else "(none)"
        kinds = " or ".join(f"{_article(k)} {k}" for k in other_kinds)
        return f"{name!r} is {kinds}, not {_article(kind)} {kind}; {accepted}: {listing}"
    return unknown_message(kind, name, available, accepted=accepted)


def _article(word: str) -> str:
    """'a' or 'an' as the word is spoken: an attention, a norm, an ffn (an initialism read letter by letter)."""
    initialism = not any(c in "aeiou" for c in word.lower())
    vowel_sound = word[:1].lower() in ("aefhilmnorsx" if initialism else "aeiou")
    return "an" if vowel_sound else "a"


def _check_params_model(params: Any, *, where: str) -> None:
    if not (inspect.isclass(params) and issubclass(params, BaseModel)):
        raise RegistryError(f"{where}: params must be a pydantic BaseModel subclass, got {params!r}")
    if params.model_config.get("extra") != "forbid":
        raise RegistryError(
            f"{where}: {params.__name__} must set model_config = ConfigDict(extra='forbid') "
            "so that a misspelt key in a spec is an error, not silently ignored"
        )
    try:
        params.model_json_schema()
    except Exception as exc:  # a Params model the docs and `specformer schema` cannot describe
        raise RegistryError(f"{where}: {params.__name__} has no JSON schema: {exc}") from exc


def _check_factory(factory: Any, params: type[BaseModel], kind: Kind, *, where: str) -> None:
    if not callable(factory):
        raise RegistryError(f"{where}: factory {factory!r} is not callable")
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return  # builtins without a signature: nothing to check
    accepted = _keyword_names(factory)
    try:  # the builder passes every size of the kind; a factory names those it needs
        signature.bind(_PARAMS_PLACEHOLDER, **{size: None for size in kind.sizes if accepted is None or size in accepted})
    except TypeError as exc:
        sizes = ", ".join(kind.sizes) or "no sizes"
        raise RegistryError(
            f"{where}: factory {getattr(factory, '__qualname__', factory)}{signature} must accept "
            f"(params: {params.__name__}, *, any of {sizes}) as components of kind {kind.name!r} do: {exc}"
        ) from exc


_PARAMS_PLACEHOLDER = object()


def _component_object(obj: Any) -> Any:
    owner = getattr(obj, "__self__", None)
    # A classmethod factory (often one the class inherits): the class is the component.
    return owner if inspect.isclass(owner) else getattr(obj, "__func__", obj)


def _source_of(obj: Any) -> str:
    target = _component_object(obj)
    try:
        file = inspect.getsourcefile(target) or "?"
        line = inspect.getsourcelines(target)[1]
    except (TypeError, OSError):
        return getattr(target, "__module__", "?") or "?"
    return f"{getattr(target, '__module__', '?')} ({file}:{line})"


__all__ = [
    "KINDS",
    "Component",
    "Kind",
    "PluginRegistry",
    "Registry",
    "Resolved",
    "call_with_sizes",
    "construct",
    "ValidationError",
    "unknown_name_message",
]
