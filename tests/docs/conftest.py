"""The docs site, built once per test session with the same command CI runs."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

# pytest runs in importlib mode: make this folder's helper modules (docs_site, docs_browser) importable.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from docs_site import REPO  # noqa: E402


@pytest.fixture(scope="session")
def site_build(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """``mkdocs build --strict`` into a temporary folder, as a user types it; the folder and the run.

    Built once per session; ``make test`` relies on this build (it runs no second one). The
    environment is the user's, less the variables the docs configure themselves, so a test can
    check that a plain build is quiet and documents the built-in plugins only.
    """
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip("mkdocs / mkdocs-material are not installed: pip install -e '.[docs]'")
    site = tmp_path_factory.mktemp("site")
    env = {k: v for k, v in os.environ.items() if k not in ("NO_MKDOCS_2_WARNING", "SPECFORMER_DOCS_PLUGINS")}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO, capture_output=True, text=True, timeout=600, env=env,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    return site, result


@pytest.fixture(scope="session")
def built_site(site_build) -> Path:
    """The folder of the strict site build (the build output is in the failure message when it fails)."""
    return site_build[0]
