"""The console script: Ctrl-C while PyTorch and the plugins are importing ends with one line and 130."""

from __future__ import annotations

import builtins
import sys

import pytest

import specformer_launch


def test_ctrl_c_while_the_cli_imports_is_one_line_and_130(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture) -> None:
    monkeypatch.delitem(sys.modules, "specformer.cli.main", raising=False)
    real_import = builtins.__import__

    def interrupted(name, *args, **kwargs):
        if name == "specformer.cli.main":
            raise KeyboardInterrupt
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", interrupted)
    assert specformer_launch.main() == 130
    err = capsys.readouterr().err
    assert err == "specformer: interrupted\n"


def test_the_console_script_runs_the_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(sys, "argv", ["specformer", "components", "norm"])
    assert specformer_launch.main() == 0
    assert "rmsnorm" in capsys.readouterr().out


def test_pyproject_points_the_console_script_here() -> None:
    from conftest import REPO

    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"]["specformer"] == "specformer_launch:main"
