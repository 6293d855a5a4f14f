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
def built_site(tmp_path_factory) -> Path:
    """``mkdocs build --strict`` into a temporary folder; the build output is kept for the failure message."""
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip("mkdocs / mkdocs-material are not installed: pip install -e '.[docs]'")
    site = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    return site
