"""``specformer new-plugin``: the package it writes installs and passes its own tests; bad names are refused."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from specformer.cli.main import main
from specformer.errors import UserError
from specformer.cli.scaffold import new_plugin
from specformer.registry import discovery

from fixtures.isolated_plugin import stage


@pytest.mark.parametrize(
    "name, fragment",
    [
        ("My-Plugin", "e.g. 'my_plugin'"),
        ("1norm", "e.g. 'p_1norm'"),
        ("class", "not a keyword"),
        ("with space", "lowercase Python identifier"),
        ("", "lowercase Python identifier"),
    ],
)
def test_a_name_that_is_not_a_lowercase_identifier_is_refused(tmp_path, name, fragment):
    with pytest.raises(UserError, match="must be a lowercase Python identifier") as info:
        new_plugin(name, directory=tmp_path)
    assert fragment in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_a_name_taken_by_an_installed_plugin_is_refused(tmp_path):
    with pytest.raises(UserError, match=r"a plugin named 'layers' is already installed \(installed plugins: .*layers"):
        new_plugin("layers", directory=tmp_path)


def test_only_a_loaded_plugin_takes_a_name(tmp_path, toy_plugin_staged, monkeypatch):
    """The suite loads the built-in plugins only (tests/conftest.py): a plugin a user installed, under the
    name a test or a docs page scaffolds (`specformer new-plugin mynorm`), does not take it there."""
    monkeypatch.syspath_prepend(str(toy_plugin_staged.site))  # installed, not selected
    discovery.reset()
    try:
        assert new_plugin("toy", directory=tmp_path / "a").name == "specformer-toy"
        with toy_plugin_staged.active():
            with pytest.raises(UserError, match=r"a plugin named 'toy' is already installed"):
                new_plugin("toy", directory=tmp_path / "b")
    finally:
        discovery.reset()


def test_a_name_taken_by_a_registered_norm_is_refused(tmp_path):
    with pytest.raises(UserError, match="a norm named 'rmsnorm' is already registered by plugin 'layers'"):
        new_plugin("rmsnorm", directory=tmp_path)


def test_an_existing_folder_is_never_overwritten(tmp_path):
    (tmp_path / "specformer-mine").mkdir()
    (tmp_path / "specformer-mine" / "keep.txt").write_text("mine")
    with pytest.raises(UserError, match="already holds files; choose a new or empty folder, or pass --force"):
        new_plugin("mine", directory=tmp_path)
    assert (tmp_path / "specformer-mine" / "keep.txt").read_text() == "mine"


def test_cli_bad_name_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["new-plugin", "Bad-Name", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: plugin name 'Bad-Name' must be a lowercase Python identifier")
    assert "Traceback" not in err


def test_cli_writes_the_package_and_says_what_to_do_next(tmp_path, capsys):
    assert main(["new-plugin", "fancy_norm", "--dir", str(tmp_path / "plugins")]) == 0
    out = capsys.readouterr().out
    root = tmp_path / "plugins" / "specformer-fancy-norm"
    assert f"pip install -e {root}" in out
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert files == [
        "README.md",
        "pyproject.toml",
        "src/specformer_fancy_norm/__init__.py",
        "src/specformer_fancy_norm/norm.py",
        "src/specformer_fancy_norm/params.py",
        "src/specformer_fancy_norm/plugin.py",
        "tests/test_fancy_norm.py",
    ]
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    assert pyproject["project"]["name"] == "specformer-fancy-norm"
    assert pyproject["project"]["entry-points"]["specformer"] == {"fancy_norm": "specformer_fancy_norm.plugin"}
    for path in root.rglob("*.py"):
        compile(path.read_text(), str(path), "exec")  # every generated module is valid Python
    package = root / "src/specformer_fancy_norm"
    assert "def __init__(self, params: FancyNormParams | None = None, *, dim: int)" in (package / "norm.py").read_text()
    # The component convention: Params in a module without torch, the class registered by its path.
    assert "import torch" not in (package / "params.py").read_text()
    plugin = (package / "plugin.py").read_text()
    assert 'factory="specformer_fancy_norm.norm:FancyNorm"' in plugin and "import torch" not in plugin
    assert "specformer_fancy_norm.norm" not in (package / "__init__.py").read_text().split("__getattr__")[0]


@pytest.mark.slow  # a subprocess run of many seconds; CI runs it in the slow suite
def test_the_written_package_installs_and_passes_its_own_tests(tmp_path):
    """As installed (its entry point found on the path), never pip-installed into this environment:
    other processes sharing it would see the plugin, then fail to import it once tmp_path is gone."""
    root = new_plugin("scaffoldcheck", directory=tmp_path)
    staged = stage(root, tmp_path / "site")
    assert staged.entry_points == {"scaffoldcheck": "specformer_scaffoldcheck.plugin"}
    with staged.active():
        eps = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="specformer")}
        assert eps.get("scaffoldcheck") == "specformer_scaffoldcheck.plugin"
    # A fresh interpreter, as a user would run it: the plugin is found through its entry point.
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(root / "tests")],
        cwd=root, capture_output=True, text=True, timeout=300, env=staged.env(),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 passed" in result.stdout
    listed = subprocess.run([sys.executable, "-m", "specformer.cli", "components", "norm"],
                            capture_output=True, text=True, timeout=120, env=staged.env())
    assert "scaffoldcheck" in listed.stdout and "[scaffoldcheck]" in listed.stdout, listed.stdout + listed.stderr
    assert "scaffoldcheck" not in {ep.name for ep in importlib.metadata.entry_points(group="specformer")}


@pytest.mark.slow  # a subprocess run of many seconds; CI runs it in the slow suite
def test_generated_test_fails_when_the_component_is_wrong(tmp_path):
    """The generated test checks the formula: break the formula and the test must say so."""
    root = new_plugin("brokencheck", directory=tmp_path)
    norm = root / "src/specformer_brokencheck/norm.py"
    norm.write_text(norm.read_text().replace("* self.weight\n", "* self.weight * 1.01\n"))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "formula", str(root / "tests")],
        cwd=root, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(root / "src")},
    )
    assert result.returncode == 1 and "1 failed" in result.stdout, result.stdout + result.stderr
    assert Path(norm).exists()
