"""Plugins: found through entry points, errors name the plugin, built-ins are ordinary plugins."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import types

import pluggy
import pytest
import torch

import specformer
from specformer.registry import discovery
from specformer.errors import RegistryError, UserError
from specformer.registry.hookspecs import hookimpl


@pytest.fixture
def fresh_plugins():
    """Forget the cached plugin manager and registry before and after the test."""
    discovery.reset()
    yield
    discovery.reset()


def test_third_party_plugin_is_found_through_its_entry_point(toy_plugin, fresh_tiny_spec):
    names = {ep.name for ep in importlib.metadata.entry_points(group="specformer")}
    assert "toy" in names
    component = specformer.get_registry().get("norm", "toy_unitnorm")
    assert component.plugin == "toy"
    info = {i.name: i for i in discovery.plugin_infos()}["toy"]
    assert (info.distribution, info.version, info.module) == ("specformer-toy", "0.0.1", "specformer_toy.plugin")
    fresh_tiny_spec["model"]["block"]["norm"] = {"kind": "toy_unitnorm", "eps": 1e-5}
    model = specformer.build(fresh_tiny_spec, seed=0)
    x = torch.randn(2, 3, 32)
    norm = model.blocks[0].attention_norm
    torch.testing.assert_close(norm(x), x / (x.norm(dim=-1, keepdim=True) + 1e-5) * 32**0.5)


def test_the_test_plugins_are_not_installed_in_the_environment():
    """The fixture plugin and the tutorial's package are staged per test, never left where a user sees them."""
    discovery.reset()
    names = {ep.name for ep in importlib.metadata.entry_points(group="specformer")}
    assert not names & {"toy", "tutorial"}, (
        f"{sorted(names & {'toy', 'tutorial'})} installed in this environment: `pip uninstall specformer-toy "
        "specformer-tutorial`; tests stage them with the toy_plugin / tutorial_staged fixtures"
    )
    assert not any(c.name in ("toy_unitnorm", "dyt") for c in specformer.get_registry())


def test_built_in_plugins_are_entry_points_like_any_other():
    eps = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="specformer")}
    assert eps["layers"] == "specformer_layers.plugin"
    assert {c.plugin for c in specformer.get_registry() if c.kind == "mixer"} >= {"layers"}


def fake_entry_points(monkeypatch, extra: list[importlib.metadata.EntryPoint]) -> None:
    real = importlib.metadata.entry_points

    def entry_points(**kwargs):
        found = list(real(**kwargs))
        return found + extra if kwargs.get("group") == "specformer" else found

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    monkeypatch.setenv(discovery.PLUGINS_VARIABLE, "installed")  # a made-up entry point has no distribution to select


def test_plugin_that_fails_to_import_is_named(monkeypatch, fresh_plugins):
    fake_entry_points(monkeypatch, [importlib.metadata.EntryPoint("broken", "no_such_module_xyz.plugin", "specformer")])
    with pytest.raises(RegistryError, match="plugin 'broken' .*failed to import: ModuleNotFoundError"):
        discovery.get_plugin_manager()


def test_duplicate_component_name_names_both_plugins(fresh_plugins):
    pm = discovery.get_plugin_manager()
    rms_params = discovery.get_registry().get("norm", "rmsnorm").params
    discovery.get_registry.cache_clear()
    dup = types.SimpleNamespace(
        specformer_register_components=hookimpl(
            lambda registry: registry.register("norm", "rmsnorm", factory=lambda params, *, dim: None, params=rms_params)
        )
    )
    discovery.register_plugin(pm, dup, name="copycat")
    with pytest.raises(RegistryError, match="norm 'rmsnorm': the name is already registered by plugin") as info:
        discovery.get_registry()
    assert "'copycat'" in str(info.value) and "'layers'" in str(info.value)


def test_plugin_with_a_misspelt_hook_is_rejected(fresh_plugins):
    pm = discovery.get_plugin_manager()
    bad = types.SimpleNamespace(specformer_register_componets=hookimpl(lambda registry: None))
    with pytest.raises(RegistryError, match="plugin 'typo'"):
        discovery.register_plugin(pm, bad, name="typo")


def test_importing_specformer_loads_no_plugin(fresh_plugins):
    assert discovery.get_plugin_manager.cache_info().currsize == 0


def test_validate_spec_hook_problems_are_reported(fresh_plugins, fresh_tiny_spec):
    pm = discovery.get_plugin_manager()

    def check(spec, registry):
        return [specformer.Problem("model.d_model", "house rule: d_model must be >= 64")] if spec.model.d_model < 64 else []

    discovery.register_plugin(pm, types.SimpleNamespace(specformer_validate_spec=hookimpl(check)), name="rules")
    with pytest.raises(specformer.SpecError, match="house rule"):
        specformer.load_spec(fresh_tiny_spec)
    fresh_tiny_spec["model"]["d_model"] = 64
    specformer.load_spec(fresh_tiny_spec)


def test_hookspecs_are_documented():
    from specformer.registry import hookspecs

    for name in dir(hookspecs):
        if name.startswith("specformer_"):
            assert (getattr(hookspecs, name).__doc__ or "").strip(), name
    assert isinstance(hookspecs.hookimpl, pluggy.HookimplMarker)


def test_specformer_plugins_builtin_leaves_out_an_installed_third_party_plugin(toy_plugin_staged, monkeypatch,
                                                                               fresh_plugins):
    """Issue 53: `pip install -e specformer-mynorm` changed every catalogue the suite and the docs show."""
    monkeypatch.syspath_prepend(str(toy_plugin_staged.site))  # installed, as pip would: on the path, not selected
    for selection, loaded in [("installed", True), ("", True), ("builtin", False), ("builtin, Specformer_Toy", True)]:
        monkeypatch.setenv(discovery.PLUGINS_VARIABLE, selection)
        discovery.reset()
        assert ("toy_unitnorm" in discovery.get_registry().names("norm")) is loaded, selection
        distributions = {info.distribution for info in discovery.plugin_infos()}
        # `installed` loads whatever else is installed too (a user's own plugins): only the toy's presence is known.
        assert ("specformer-toy" in distributions) is loaded and (loaded or distributions == {"specformer"}), selection


@pytest.mark.parametrize("selection, message", [
    ("all", "SPECFORMER_PLUGINS='all' is not a plugin selection; accepted: 'installed' (every installed plugin"),
    ("specformer-toy", "'builtin' followed by the distributions to load as well, comma-separated"),
    ("builtin,", "is not a plugin selection"),
    ("builtin,specformer-nope", "SPECFORMER_PLUGINS names 'specformer-nope', which installs no specformer plugin; "
                                "installed plugin distributions besides specformer's own: "),
])
def test_a_bad_plugin_selection_is_one_message_and_exit_2(toy_plugin, monkeypatch, capsys, selection, message):
    from specformer.cli.main import main

    monkeypatch.setenv(discovery.PLUGINS_VARIABLE, selection)
    discovery.reset()
    with pytest.raises(UserError) as info:
        discovery.get_registry()
    assert message in str(info.value)
    assert "nope" not in selection or "specformer-toy" in str(info.value)  # what is installed, to choose from
    assert main(["components", "norm"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_a_plugin_the_user_installed_is_invisible_to_the_suites_subprocesses(toy_plugin_staged):
    """tests/conftest.py selects the built-in plugins for the session and every process it starts
    (the docs' printed commands run in such processes): a plugin found on the path stays out."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(toy_plugin_staged.site), os.environ.get("PYTHONPATH", "")])}
    listed = subprocess.run([sys.executable, "-m", "specformer.cli", "components", "norm"],
                            capture_output=True, text=True, timeout=120, env=env)
    assert listed.returncode == 0 and "rmsnorm" in listed.stdout, listed.stdout + listed.stderr
    assert "toy_unitnorm" not in listed.stdout
    staged = subprocess.run([sys.executable, "-m", "specformer.cli", "components", "norm"],
                            capture_output=True, text=True, timeout=120, env=toy_plugin_staged.env())
    assert "toy_unitnorm" in staged.stdout, staged.stdout + staged.stderr  # a test that stages it sees it
