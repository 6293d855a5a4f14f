"""Finding plugins and building the registry from them.

Nothing happens at import time: :func:`get_plugin_manager` loads the entry points of
group ``specformer`` the first time it is called, and :func:`get_registry` asks every
plugin to register its components the first time it is called.

Each plugin brings its own extension points: its ``specformer_add_hookspecs`` runs as it
is registered, and every plugin's ``specformer_add_kinds`` runs before any plugin's
``specformer_register_components``. So the hooks a plugin implements are checked once
all plugins are loaded, and components can be registered for any plugin's kind.

The environment variable ``SPECFORMER_PLUGINS`` narrows which installed plugins load
(:func:`selected_distributions`): ``builtin`` loads specformer's own only, whatever else is
installed, so output and tests do not change with the plugins a user happens to have.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import os
import re
from dataclasses import dataclass
from typing import Any

import pluggy

from specformer.registry import hookspecs
from specformer.errors import RegistryError, UserError
from specformer.registry.components import Registry

ENTRY_POINT_GROUP = "specformer"
#: The environment variable choosing which installed plugins load (docs/writing-a-plugin.md).
PLUGINS_VARIABLE = "SPECFORMER_PLUGINS"
#: The distribution whose entry points are specformer's own (built-in) plugins.
BUILTIN_DISTRIBUTION = "specformer"


@dataclass(frozen=True)
class PluginInfo:
    """Where a loaded plugin came from."""

    name: str
    module: str
    distribution: str
    version: str
    file: str


_infos: dict[str, PluginInfo] = {}


@functools.cache
def get_plugin_manager() -> pluggy.PluginManager:
    """The plugin manager with the hookspecs and the ``specformer`` entry points loaded (those
    ``SPECFORMER_PLUGINS`` selects: every installed one unless it says otherwise)."""
    pm = new_plugin_manager()
    for ep in sorted(_selected_entry_points(), key=lambda e: e.name):
        if pm.has_plugin(ep.name):
            continue  # the same distribution found twice on sys.path
        try:
            plugin = ep.load()
        except Exception as exc:
            dist = ep.dist.name if ep.dist else "?"
            raise RegistryError(
                f"plugin {ep.name!r} (entry point {ep.value!r} of distribution {dist!r}) failed to import: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        register_plugin(pm, plugin, name=ep.name, distribution=ep.dist.name if ep.dist else "?",
                        version=ep.dist.version if ep.dist else "?", check=False)
    check_hooks(pm)  # only now: a plugin may implement a hook that a plugin loaded after it declares
    return pm


def selected_distributions() -> frozenset[str] | None:
    """The distributions whose plugins load, as ``SPECFORMER_PLUGINS`` says (normalized names);
    None for every installed one (the variable unset, empty or ``installed``)."""
    value = os.environ.get(PLUGINS_VARIABLE, "").strip()
    if value in ("", "installed"):
        return None
    names = [name.strip() for name in value.split(",")]
    extra = names[1:]
    if names[0] != "builtin" or not all(extra) or {"builtin", "installed"} & set(extra):
        raise UserError(
            f"{PLUGINS_VARIABLE}={value!r} is not a plugin selection; accepted: 'installed' (every installed "
            f"plugin, the default), 'builtin' (specformer's own plugins only), or 'builtin' followed by the "
            f"distributions to load as well, comma-separated, e.g. 'builtin,specformer-mynorm'"
        )
    return frozenset(_normalized(name) for name in (BUILTIN_DISTRIBUTION, *extra))


def _selected_entry_points() -> list[importlib.metadata.EntryPoint]:
    found = list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
    selected = selected_distributions()
    if selected is None:
        return found
    by_distribution = {_normalized(ep.dist.name): ep.dist.name for ep in found if ep.dist is not None}
    unknown = sorted(selected - by_distribution.keys() - {BUILTIN_DISTRIBUTION})
    if unknown:
        others = sorted(name for key, name in by_distribution.items() if key != BUILTIN_DISTRIBUTION)
        raise UserError(
            f"{PLUGINS_VARIABLE} names {', '.join(map(repr, unknown))}, which installs no specformer plugin; "
            f"installed plugin distributions besides specformer's own: {', '.join(others) or 'none'}"
        )
    return [ep for ep in found if ep.dist is not None and _normalized(ep.dist.name) in selected]


def _normalized(distribution: str) -> str:
    """A distribution name as pip compares them: case, '-', '_' and '.' do not matter (PEP 503)."""
    return re.sub(r"[-_.]+", "-", distribution).lower()


def new_plugin_manager() -> pluggy.PluginManager:
    """A plugin manager with the core's hookspecs, ready to let each plugin add its own."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    pm.hook.specformer_add_hookspecs.call_historic(kwargs={"pluginmanager": pm})
    return pm


def register_plugin(pm: pluggy.PluginManager, plugin: Any, *, name: str, distribution: str = "(in process)",
                    version: str = "", check: bool = True) -> None:
    """Register one plugin object (its ``specformer_add_hookspecs`` runs now), checking its hooks unless ``check=False``."""
    try:
        pm.register(plugin, name=name)
    except (ValueError, pluggy.PluginValidationError) as exc:
        # Registering a plugin that adds hookspecs checks the implementations already registered:
        # the one that does not fit may be another plugin's.
        culprit = getattr(exc, "plugin", None)
        blamed = (pm.get_name(culprit) if culprit is not None else None) or name
        raise RegistryError(f"plugin {blamed!r}: {exc}") from exc
    if check:
        check_hooks(pm)
    _infos[name] = PluginInfo(
        name=name,
        module=getattr(plugin, "__name__", type(plugin).__name__),
        distribution=distribution,
        version=version,
        file=getattr(plugin, "__file__", "") or "",
    )


def check_hooks(pm: pluggy.PluginManager) -> None:
    """RegistryError naming the plugin that implements a hook no plugin declared (a misspelt hook)."""
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        name = pm.get_name(exc.plugin) if exc.plugin is not None else "?"
        raise RegistryError(f"plugin {name!r}: {exc}") from exc


def plugin_infos() -> list[PluginInfo]:
    pm = get_plugin_manager()
    return [_infos[name] for name, _ in sorted(pm.list_name_plugin()) if name in _infos]


@functools.cache
def get_registry() -> Registry:
    """The registry filled by every plugin's ``specformer_register_components``."""
    return build_registry(get_plugin_manager())


def build_registry(pm: pluggy.PluginManager) -> Registry:
    """Every plugin's kinds first, then every plugin's components, each in registration order."""
    registry = Registry()
    for hook in (pm.hook.specformer_add_kinds, pm.hook.specformer_register_components):
        for impl in hook.get_hookimpls():
            impl.function(registry=registry.for_plugin(impl.plugin_name))
    return registry


def reset() -> None:
    """Forget the loaded plugins and registry (tests use this after installing a plugin)."""
    get_plugin_manager.cache_clear()
    get_registry.cache_clear()
    _infos.clear()
    importlib.invalidate_caches()
