"""A plugin brings its own extension points: hookspecs (like pytest_addhooks) and registry kinds.

Each test loads plugins into a fresh plugin manager in the order that makes the
mechanism matter: the plugin using an extension point is registered *before* the
plugin that declares it, as entry points sorted by name may well do.
"""

from __future__ import annotations

import types

import pluggy
import pytest
from pydantic import Field

from specformer.registry import discovery
from specformer.errors import RegistryError
from specformer.registry.hookspecs import PROJECT, hookimpl
from specformer.registry.params import Params
from specformer.registry.components import KINDS

hookspec = pluggy.HookspecMarker(PROJECT)


class WidgetHooks:
    """The hookspecs a 'widgets' plugin declares for other plugins."""

    @hookspec
    def widgets_on_spin(self, speed: int) -> int:
        """A widget spun at ``speed``."""


class SpinParams(Params):
    speed: int = Field(default=1, gt=0, description="How fast.")


def widgets_plugin() -> types.SimpleNamespace:
    """Declares the hook ``widgets_on_spin`` and the kind ``widget`` (factories take a ``size``)."""
    return types.SimpleNamespace(
        specformer_add_hookspecs=hookimpl(lambda pluginmanager: pluginmanager.add_hookspecs(WidgetHooks)),
        specformer_add_kinds=hookimpl(lambda registry: registry.add_kind("widget", doc="A thing that spins.",
                                                                         sizes=("size",))),
    )


def user_plugin() -> types.SimpleNamespace:
    """Implements the widgets plugin's hook and registers a component of its kind."""
    return types.SimpleNamespace(
        widgets_on_spin=hookimpl(lambda speed: speed * 2),
        specformer_register_components=hookimpl(lambda registry: registry.register(
            "widget", "spinner", factory=lambda params, *, size: ("spinner", size, params.speed), params=SpinParams)),
    )


def test_a_hook_declared_by_a_plugin_loaded_later_is_checked_and_called():
    pm = discovery.new_plugin_manager()
    discovery.register_plugin(pm, user_plugin(), name="user", check=False)  # its hook has no spec yet
    discovery.register_plugin(pm, widgets_plugin(), name="widgets", check=False)
    discovery.check_hooks(pm)
    assert pm.hook.widgets_on_spin(speed=3) == [6]


def test_a_hook_nobody_declares_names_the_plugin_that_implements_it():
    pm = discovery.new_plugin_manager()
    discovery.register_plugin(pm, user_plugin(), name="user", check=False)
    with pytest.raises(RegistryError, match="plugin 'user'.*widgets_on_spin"):
        discovery.check_hooks(pm)  # the widgets plugin is not installed


def test_a_plugin_registers_components_of_a_kind_another_plugin_adds_later():
    pm = discovery.new_plugin_manager()
    discovery.register_plugin(pm, user_plugin(), name="user", check=False)
    discovery.register_plugin(pm, widgets_plugin(), name="widgets")
    registry = discovery.build_registry(pm)
    assert "widget" in registry.kinds and "widget" not in KINDS
    spinner = registry.resolve("widget", {"kind": "spinner", "speed": 5})
    assert spinner.make(size=7) == ("spinner", 7, 5)
    assert registry.get("widget", "spinner").plugin == "user"


def test_a_kind_defined_differently_by_two_plugins_names_the_second():
    pm = discovery.new_plugin_manager()
    discovery.register_plugin(pm, widgets_plugin(), name="widgets")
    rival = types.SimpleNamespace(specformer_add_kinds=hookimpl(
        lambda registry: registry.add_kind("widget", doc="Something else.", sizes=())))
    discovery.register_plugin(pm, rival, name="rival")
    with pytest.raises(RegistryError, match="plugin 'rival' redefines kind 'widget'"):
        discovery.build_registry(pm)



def test_the_core_declares_only_the_kinds_a_decoder_is_built_from():
    # per_layer_input: the optional model.per_layer_input part (Gemma 4's per-layer embeddings) the Decoder calls.
    assert set(KINDS) == {"positional", "norm", "mixer", "ffn", "layout", "residual", "per_layer_input"}


def test_the_built_in_plugins_own_their_kinds_and_hooks():
    registry = discovery.get_registry()
    assert {"sampler", "rope_scaling"} <= set(registry.kinds) and not {"sampler", "rope_scaling"} & set(KINDS)
    hooks = discovery.get_plugin_manager().hook
    from specformer.registry import hookspecs

    for hook, owner in (("specformer_on_generate_end", "specformer_generate"), ("specformer_on_train_start", "specformer_train"),
                        ("specformer_on_train_step", "specformer_train"), ("specformer_on_eval", "specformer_train"),
                        ("specformer_on_checkpoint_saved", "specformer_train"), ("specformer_on_train_end", "specformer_train")):
        assert not hasattr(hookspecs, hook)
        assert getattr(hooks, hook).spec.namespace.__name__ == f"{owner}.hookspecs"
