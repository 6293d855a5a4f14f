"""Where a checkpoint's components came from, so that loading it elsewhere can say what to install.

When a model is saved, the checkpoint header records, for every component its spec
uses (nested ones included: an attention's ``qk_norm``, the samplers of the
``generate`` section), the plugin that registered it and that plugin's distribution
and version. Loading the checkpoint where one of those components is not registered
then names the plugin and the ``pip install`` that brings it back, instead of an
"unknown norm" with a guess at some unrelated built-in.

The record is additive metadata: checkpoints written before it existed load as before.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import Any

from pydantic import BaseModel

from specformer.errors import CheckpointError
from specformer.registry.discovery import plugin_infos
from specformer.registry.components import Registry, Resolved
from specformer.renamed import current_kind
from specformer.spec.validate import resolve_model

#: The header key holding the JSON list of :class:`ComponentSource` records.
HEADER_KEY = "component_sources"

# What a plugin registered in the running process (not from an installed distribution) records.
_NO_DISTRIBUTION = {"", "?", "(in process)"}


@dataclass(frozen=True)
class ComponentSource:
    """One component a checkpoint uses and the plugin (and distribution) that provided it."""

    kind: str
    name: str
    plugin: str
    distribution: str
    version: str


def components_used(spec: Any, registry: Registry) -> list[ComponentSource]:
    """Every component ``spec`` (a validated :class:`~specformer.spec.Spec`) uses, each once, sorted."""
    found: dict[tuple[str, str], Any] = {}

    def visit(value: Any) -> None:
        if isinstance(value, Resolved):
            found[(value.component.kind, value.component.name)] = value.component
            visit(value.params)
        elif isinstance(value, BaseModel):
            for field in type(value).model_fields:
                visit(getattr(value, field, None))
            for extra in (value.model_extra or {}).values():
                visit(extra)
        elif isinstance(value, (list, tuple)):
            for item in value:
                visit(item)
        elif isinstance(value, dict):
            for item in value.values():
                visit(item)

    resolved, _problems = resolve_model(spec.model, registry)
    if resolved is not None:  # a model built with another registry: record what this one knows
        visit([resolved.positional.resolved, resolved.final_norm.resolved])
        visit([part.resolved for part in (resolved.embedding_norm, resolved.per_layer_input) if part is not None])
        visit([part.resolved for layer in resolved.layers for part in layer.values()])
    visit(list((spec.model_extra or {}).values()))

    infos = {info.name: info for info in plugin_infos()}
    out = []
    for key in sorted(found):
        component = found[key]
        info = infos.get(component.plugin)
        out.append(ComponentSource(
            kind=component.kind,
            name=component.name,
            plugin=component.plugin,
            distribution=info.distribution if info else "",
            version=info.version if info else "",
        ))
    return out


def header_entry(spec: Any, registry: Registry) -> dict[str, str]:
    """The checkpoint header metadata recording where ``spec``'s components came from."""
    return {HEADER_KEY: json.dumps([asdict(s) for s in components_used(spec, registry)])}


def recorded_sources(metadata: dict[str, str]) -> list[ComponentSource]:
    """The records a checkpoint header holds (kinds renamed since read as they are now); none for a checkpoint written
    before they existed."""
    text = metadata.get(HEADER_KEY)
    if not text:
        return []
    try:
        sources = [ComponentSource(**{k: str(entry[k]) for k in ComponentSource.__dataclass_fields__})
                   for entry in json.loads(text)]
    except (json.JSONDecodeError, TypeError, KeyError):
        return []  # a damaged record is no worse than none: the spec's own validation still runs
    return [replace(s, kind=current_kind(s.kind)) for s in sources]


def check_installed(metadata: dict[str, str], registry: Registry, *, where: str) -> None:
    """Raise :class:`CheckpointError` naming the plugin to install for every component not registered here."""
    missing: dict[str, list[ComponentSource]] = {}
    for source in recorded_sources(metadata):
        if source.kind not in registry.kinds or source.name not in registry.names(source.kind):
            missing.setdefault(source.plugin, []).append(source)
    if not missing:
        return
    loaded = {info.name: info for info in plugin_infos()}
    lines = [missing_plugin_message(sources, loaded.get(plugin)) for plugin, sources in sorted(missing.items())]
    raise CheckpointError(f"{where}: " + "\n".join(lines))


def missing_plugin_message(sources: list[ComponentSource], loaded: Any = None) -> str:
    """One plugin's missing components and how to install it; ``loaded`` is its PluginInfo here, if any."""
    first = sources[0]
    needs = ", ".join(f"{s.kind} {s.name!r}" for s in sources)
    if first.distribution in _NO_DISTRIBUTION:
        return (
            f"the checkpoint was written with plugin {first.plugin!r} (registered in-process, not from an "
            f"installed distribution), which is not loaded here; it provides {needs}. Register that plugin "
            "before loading (specformer.registry.discovery.register_plugin)"
        )
    written = f"plugin {first.plugin!r} (distribution {first.distribution!r}, version {first.version})"
    install = f"pip install {first.distribution}=={first.version}" if first.version else f"pip install {first.distribution}"
    if loaded is not None:
        return (
            f"the checkpoint was written with {written}; the version installed here ({loaded.version}) "
            f"has no {needs}. Install the version it was written with: {install}"
        )
    return (
        f"the checkpoint was written with {written}, which is not installed here; it provides {needs}. "
        f"Install it with: {install}"
    )


__all__ = ["HEADER_KEY", "ComponentSource", "check_installed", "components_used", "header_entry", "recorded_sources"]
