"""The docs site, built once per test session with the same command CI runs."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# pytest runs in importlib mode: make this folder's helper modules (docs_site, docs_browser) importable.
# Appended, not put first: `from conftest import ...` in other folders means tests/conftest.py.
sys.path.append(str(Path(__file__).resolve().parent))

from docs_site import REPO  # noqa: E402


class _SiteBuild:
    """``mkdocs build --strict`` into a temporary folder, as a user types it, run in the background.

    Started as soon as the session's tests are collected (when any of them needs the site), so
    the build runs on the second core beside the tests before the docs ones; ``make test``
    relies on this build (it runs no second one). The environment is the user's, less the
    variables the docs configure themselves, so a test can check that a plain build is quiet
    and documents the built-in plugins only.
    """

    def __init__(self, folder: Path) -> None:
        self.site = folder / "site"
        self.log = folder / "build.log"
        # SPECFORMER_PLUGINS too (the suite sets it): the build itself must leave out what else is installed.
        configured = ("NO_MKDOCS_2_WARNING", "SPECFORMER_DOCS_PLUGINS", "SPECFORMER_PLUGINS")
        env = {k: v for k, v in os.environ.items() if k not in configured}
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(self.site)],
                cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env,
            )

    def wait(self) -> tuple[Path, str]:
        """The site folder and everything the build printed; fails the caller if the build failed."""
        code = self.process.wait(timeout=600)
        output = self.log.read_text(encoding="utf-8", errors="replace")
        assert code == 0, f"mkdocs build --strict failed:\n{output}"
        return self.site, output

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


_build: _SiteBuild | None = None


def _docs_extra_installed() -> bool:
    return importlib.util.find_spec("mkdocs") is not None and importlib.util.find_spec("material") is not None


#: The tests that wait for one of the two slow things, by the session fixture they use: under pytest-xdist
#: (`make test`), each group runs in one worker (``--dist loadgroup``), so each thing runs once.
_GROUPS = {"site_build": "docs-site", "built_site": "docs-site", "results": "printed-commands"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ())) & set(_GROUPS)
        if used:
            item.add_marker(pytest.mark.xdist_group(_GROUPS[sorted(used)[0]]))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the two slow things the docs tests wait for (the site build, the printed commands)
    as soon as the tests are collected, so they run on the second core beside the tests before them.

    Under pytest-xdist every worker collects every test, and which one runs a group is not known yet:
    there the first test that needs one starts it (the other worker goes on meanwhile).
    """
    global _build
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    needs = [set(getattr(item, "fixturenames", ())) for item in session.items]
    if any({"site_build", "built_site"} & n for n in needs) and _docs_extra_installed() and _build is None:
        _build = _SiteBuild(Path(tempfile.mkdtemp(prefix="specformer-site-")))
    if any("results" in n for n, item in zip(needs, session.items) if item.path.name == "test_printed_commands.py"):
        import printed_commands
        from fixtures.isolated_plugin import stage

        if printed_commands.started is None:
            root = Path(tempfile.mkdtemp(prefix="specformer-printed-"))
            tutorial = stage(REPO / "examples" / "specformer-tutorial", root / "tutorial")
            printed_commands.started = printed_commands.Runs(printed_commands.collect(), root, {"tutorial": tutorial})


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _build is not None:
        _build.stop()
        shutil.rmtree(_build.site.parent, ignore_errors=True)
    printed_commands = sys.modules.get("printed_commands")
    if printed_commands is not None and printed_commands.started is not None:
        printed_commands.started.stop()
        shutil.rmtree(printed_commands.started.root, ignore_errors=True)


@pytest.fixture(scope="session")
def site_build() -> tuple[Path, str]:
    """The strict build's site folder and its output (see :class:`_SiteBuild`)."""
    global _build
    if not _docs_extra_installed():
        pytest.skip("mkdocs / mkdocs-material are not installed: pip install -e '.[docs]'")
    if _build is None:  # not started at collection (e.g. the fixture was reached another way)
        _build = _SiteBuild(Path(tempfile.mkdtemp(prefix="specformer-site-")))
    return _build.wait()


@pytest.fixture(scope="session")
def built_site(site_build) -> Path:
    """The folder of the strict site build (the build output is in the failure message when it fails)."""
    return site_build[0]
