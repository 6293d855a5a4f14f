"""The set-up is quiet: building specformer's metadata warns about nothing, the license is declared as packaging expects."""

from __future__ import annotations

import subprocess
import sys

import pytest
from docs_site import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# setuptools' own build hook, as pip runs it for `pip install -e .`, in a fresh interpreter.
BUILD_METADATA = """
import sys, warnings
warnings.simplefilter("always")
from setuptools import build_meta
build_meta.prepare_metadata_for_build_wheel(sys.argv[1])
"""


def test_the_license_is_an_spdx_expression_with_its_file():
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["license"] == "Apache-2.0"  # a string: the TOML table form is deprecated
    assert all((REPO / name).is_file() for name in project["license-files"])
    assert "Apache License" in (REPO / "LICENSE").read_text(encoding="utf-8")[:200]


def test_building_the_metadata_prints_no_warning(tmp_path):
    pytest.importorskip("setuptools")
    result = subprocess.run([sys.executable, "-c", BUILD_METADATA, str(tmp_path)], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "Warning" not in result.stderr and "deprecated" not in result.stderr.lower(), result.stderr
    (metadata,) = tmp_path.glob("*.dist-info/METADATA")
    assert "License-Expression: Apache-2.0" in metadata.read_text(encoding="utf-8")


def test_getting_started_names_the_extras_the_makefile_installs():
    """Issue 53: the page listed train, test and docs while `make` installed eval too."""
    import re

    installed = re.search(r"install -e '\.\[([\w,]+)\]'", (REPO / "Makefile").read_text(encoding="utf-8"))
    page = " ".join((REPO / "docs" / "getting-started.md").read_text(encoding="utf-8").split())
    named = re.search(r"installed in editable mode with its ((?:`\w+`,? )+and `\w+`) extras", page)
    assert installed and named, "the Makefile's install line or the page's sentence naming its extras moved"
    assert re.findall(r"`(\w+)`", named[1]) == installed[1].split(",")
