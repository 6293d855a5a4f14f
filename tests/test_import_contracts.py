"""The plugin boundaries (docs/architecture.md, "Plugins") hold: import-linter's contracts in pyproject.toml.

The contracts: the core imports no plugin; plugins import only downward through the
layers; and every package outside a plugin reaches it through its package root. The
second test keeps the contracts complete: a new plugin folder must be placed in the
layers and given its own root-only contract, or this fails.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the test extra installs tomli on 3.10
    import tomli as tomllib

importlinter_cli = pytest.importorskip("importlinter.cli", reason="import-linter is in the test extra")

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = REPO / "pyproject.toml"


def test_every_import_contract_is_kept(capsys: pytest.CaptureFixture[str]) -> None:
    code = importlinter_cli.lint_imports(config_filename=str(PYPROJECT), no_cache=True)
    report = capsys.readouterr().out
    assert code == 0, f"an import breaks a plugin boundary (docs/architecture.md):\n{report}"


def test_the_contracts_cover_every_plugin_package() -> None:
    config = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["tool"]["importlinter"]
    packages = {p.name for p in (REPO / "plugins").iterdir() if (p / "__init__.py").is_file()}
    contracts = {c["id"]: c for c in config["contracts"]}
    layered = {name.strip() for layer in contracts["plugin-layers"]["layers"] for name in layer.split("|")}
    assert layered == packages, "every plugin package sits in exactly one layer of the plugin-layers contract"
    assert set(contracts["core-imports-no-plugin"]["forbidden_modules"]) == packages
    assert set(config["root_packages"]) >= packages
    for package in packages:
        protected = contracts.get(f"{package}-through-its-root")
        assert protected is not None, f"{package} has no contract keeping other packages to its root"
        assert protected["type"] == "protected"
        assert protected["protected_modules"] == [f"{package}.**"] and protected["allowed_importers"] == [package]


def test_the_contract_quoted_in_the_docs_is_the_one_in_force() -> None:
    page = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    quoted = tomllib.loads(page.split("```toml\n", 1)[1].split("```", 1)[0])["tool"]["importlinter"]
    config = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["tool"]["importlinter"]
    in_force = {c["id"]: c for c in config["contracts"]}
    assert quoted["root_packages"] == config["root_packages"]
    assert quoted["contracts"] and all(contract == in_force.get(contract["id"]) for contract in quoted["contracts"])
