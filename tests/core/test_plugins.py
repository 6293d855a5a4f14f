"""Plugins: found through entry points, errors name the plugin, built-ins are ordinary plugins."""

from __future__ import annotations

import importlib.metadata
import types

import pluggy
import pytest
import torch

import specformer
from specformer.registry import discovery as plugins
from specformer.errors import RegistryError
from specformer.registry.hookspecs import hookimpl


@pytest.fixture
def fresh_plugins():
    """Forget the cached plugin manager and registry before and after the test."""
    plugins.reset()
    yield
    plugins.reset()


def test_third_party_plugin_is_found_through_its_entry_point(toy_plugin, tiny_spec):
    names = {ep.name for ep in importlib.metadata.entry_points(group="specformer")}
    assert "toy" in names
    component = specformer.get_registry().get("norm", "toy_unitnorm")
    assert component.plugin == "toy"
    info = {i.name: i for i in plugins.plugin_infos()}["toy"]
    assert (info.distribution, info.version, info.module) == ("specformer-toy", "0.0.1", "specformer_toy.plugin")
    tiny_spec["model"]["block"]["norm"] = {"kind": "toy_unitnorm", "eps": 1e-5}
    model = specformer.build(tiny_spec, seed=0)
    x = torch.randn(2, 3, 32)
    norm = model.blocks[0].attention_norm
    torch.testing.assert_close(norm(x), x / (x.norm(dim=-1, keepdim=True) + 1e-5) * 32**0.5)


def test_the_test_plugins_are_not_installed_in_the_environment():
    """The fixture plugin and the tutorial's package are staged per test, never left where a user sees them."""
    plugins.reset()
    names = {ep.name for ep in importlib.metadata.entry_points(group="specformer")}
    assert not names & {"toy", "tutorial"}, (
        f"{sorted(names & {'toy', 'tutorial'})} installed in this environment: `pip uninstall specformer-toy "
        "specformer-tutorial`; tests stage them with the toy_plugin / tutorial_staged fixtures"
    )
    assert not any(c.name in ("toy_unitnorm", "dyt") for c in specformer.get_registry())


def test_built_in_plugins_are_entry_points_like_any_other():
    eps = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="specformer")}
    assert eps["layers"] == "specformer_layers.plugin"
    assert {c.plugin for c in specformer.get_registry() if c.kind == "attention"} >= {"layers"}


def fake_entry_points(monkeypatch, extra: list[importlib.metadata.EntryPoint]) -> None:
    real = importlib.metadata.entry_points

    def entry_points(**kwargs):
        found = list(real(**kwargs))
        return found + extra if kwargs.get("group") == "specformer" else found

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)


def test_plugin_that_fails_to_import_is_named(monkeypatch, fresh_plugins):
    fake_entry_points(monkeypatch, [importlib.metadata.EntryPoint("broken", "no_such_module_xyz.plugin", "specformer")])
    with pytest.raises(RegistryError, match="plugin 'broken' .*failed to import: ModuleNotFoundError"):
        plugins.get_plugin_manager()


def test_duplicate_component_name_names_both_plugins(fresh_plugins):
    pm = plugins.get_plugin_manager()
    rms_params = plugins.get_registry().get("norm", "rmsnorm").params
    plugins.get_registry.cache_clear()
    dup = types.SimpleNamespace(
        specformer_register_components=hookimpl(
            lambda registry: registry.register("norm", "rmsnorm", factory=lambda params, *, dim: None, params=rms_params)
        )
    )
    plugins.register_plugin(pm, dup, name="copycat")
    with pytest.raises(RegistryError, match="norm 'rmsnorm': the name is already registered by plugin") as info:
        plugins.get_registry()
    assert "'copycat'" in str(info.value) and "'layers'" in str(info.value)


def test_plugin_with_a_misspelt_hook_is_rejected(fresh_plugins):
    pm = plugins.get_plugin_manager()
    bad = types.SimpleNamespace(specformer_register_componets=hookimpl(lambda registry: None))
    with pytest.raises(RegistryError, match="plugin 'typo'"):
        plugins.register_plugin(pm, bad, name="typo")


def test_importing_specformer_loads_no_plugin(fresh_plugins):
    assert plugins.get_plugin_manager.cache_info().currsize == 0


def test_validate_spec_hook_problems_are_reported(fresh_plugins, tiny_spec):
    pm = plugins.get_plugin_manager()

    def check(spec, registry):
        return [specformer.Problem("model.d_model", "house rule: d_model must be >= 64")] if spec.model.d_model < 64 else []

    plugins.register_plugin(pm, types.SimpleNamespace(specformer_validate_spec=hookimpl(check)), name="rules")
    with pytest.raises(specformer.SpecError, match="house rule"):
        specformer.load_spec(tiny_spec)
    tiny_spec["model"]["d_model"] = 64
    specformer.load_spec(tiny_spec)


def test_hookspecs_are_documented():
    from specformer.registry import hookspecs

    for name in dir(hookspecs):
        if name.startswith("specformer_"):
            assert (getattr(hookspecs, name).__doc__ or "").strip(), name
    assert isinstance(hookspecs.hookimpl, pluggy.HookimplMarker)
