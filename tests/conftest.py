"""Shared fixtures: paths, small specs, and the hand-written reference models."""

from __future__ import annotations

import getpass
import os
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SPECS = REPO / "specs"
SHARED_DATA = REPO.parent / "shared" / "data"
sys.path.insert(0, str(REPO / "tests"))  # `from conftest import ...` under --import-mode=importlib

# The suite tests specformer with its own plugins: one a user installed (`specformer new-plugin mynorm`,
# `pip install -e specformer-mynorm`) would add a norm to every catalogue count and error list the tests
# check. Set here, before anything loads the plugins, and so for every subprocess a test starts too; a
# test that needs a third-party plugin stages it (fixtures/isolated_plugin.py), which adds it to this.
os.environ["SPECFORMER_PLUGINS"] = "builtin"

# Under pytest-xdist (`-n 2`, what `make test` runs) each worker has a core of its own; tiny models are fastest on one
# thread anyway. Alone, two threads.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, torch.get_num_threads()))

# Inductor (PyTorch 2.13) files a kernel compiled under one ATEN_CPU_CAPABILITY under the same key
# as under another and reads it back later: after a run on AVX2 kernels, compiled FlexAttention
# gave wrong outputs in the next run on an AVX-512 machine's own kernels. A run on chosen kernels
# (make test-kernels, docs/testing.md) therefore compiles into a cache of its own.
if os.environ.get("ATEN_CPU_CAPABILITY") and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    try:
        _user = getpass.getuser()
    except (KeyError, OSError):  # no login name (a bare container)
        _user = f"uid{os.getuid()}"
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(
        tempfile.gettempdir(), f"torchinductor_{_user}_{os.environ['ATEN_CPU_CAPABILITY'].lower()}")

from fixtures import tiny  # noqa: E402  (needs tests/ on sys.path, above)
from fixtures.isolated_plugin import StagedPlugin, stage  # noqa: E402

TOY_PLUGIN = REPO / "tests" / "fixtures" / "toy_plugin"
TUTORIAL = REPO / "examples" / "specformer-tutorial"


def pytest_configure(config: pytest.Config) -> None:
    # The mutation run (tools/mutation.py) selects tests by path and by this marker, never by name.
    config.addinivalue_line(
        "markers",
        "mutation_exempt(reason): left out of mutation runs (tools/mutation.py); the reason says why: mutmut's "
        "trampolines break the test on unmutated code (torch.compile, warning stacklevels), or it takes "
        "seconds per mutant where a faster test pins the same behaviour")


@pytest.fixture(autouse=True)
def _renamed_lines_said_anew() -> None:
    """Each test hears specformer.renamed's deprecation lines afresh (a process says each line once)."""
    from specformer.renamed import forget_said

    forget_said()


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Torch on one thread for the test, and the count it had restored after.

    Tiny models run fastest on one thread, and far faster when other work shares the cores.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def toy_plugin_staged(tmp_path_factory) -> StagedPlugin:
    """The toy third-party plugin (``toy_unitnorm``), laid out once per session outside the environment."""
    return stage(TOY_PLUGIN, tmp_path_factory.mktemp("toy_plugin"))


@pytest.fixture
def toy_plugin(toy_plugin_staged: StagedPlugin):
    """The toy plugin visible to this interpreter through its entry point, for one test only."""
    with toy_plugin_staged.active() as staged:
        yield staged


@pytest.fixture(scope="session")
def tutorial_staged(tmp_path_factory) -> StagedPlugin:
    """The plugin tutorial's package (examples/specformer-tutorial), laid out once per session."""
    return stage(TUTORIAL, tmp_path_factory.mktemp("tutorial_plugin"))


@pytest.fixture
def fresh_tiny_spec() -> dict:
    """A fresh copy of the shared tiny spec (fixtures/tiny.py's ``tiny_spec()``), for a test to change."""
    return tiny.tiny_spec()


#: The same spec as a module constant, for tests that build from it at import time; never change it.
TINY = tiny.tiny_spec()
