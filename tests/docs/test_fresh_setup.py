"""A newcomer's first hour, in a fresh virtual environment: the README's and getting-started's commands work
with what the Makefile's set-up installs, and nothing more.

The other docs tests run in the development environment, which may hold packages no extra
installs; a command that needs one works there and fails on a fresh clone. Here the
Makefile's own set-up rule (``$(STAMP)``: ``python3 -m venv``, the pinned PyTorch, specformer
with its extras) makes a new environment, and the command blocks of README.md and
docs/getting-started.md run in it through its ``specformer`` script, collected, planned and
checked by ``printed_commands`` as in test_printed_commands.py (small step counts for
training). ``make demo`` runs as its recipe (``specformer train specs/tiny.yaml --overwrite``,
at two steps), followed by the ``generate`` command it prints. ``make test`` stays skipped: it
is the suite this test is part of.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import printed_commands as pc

SOURCES = ("README.md", "docs/getting-started.md")
#: What `make demo` runs once .venv is set up (the Makefile's `demo` recipe).
DEMO = "specformer train specs/tiny.yaml --overwrite"
PRINTED = pc.expand_make([c for source in SOURCES for c in pc.from_markdown(pc.REPO / source)])

#: The test session's own settings, which a user's shell does not have: the development
#: environment's import path, and the suite's plugin selection (tests/conftest.py).
SESSION_ONLY = ("PYTHONPATH", "VIRTUAL_ENV", "SPECFORMER_PLUGINS", "PYTHONHOME")


def user_environment(venv: Path | None = None) -> dict[str, str]:
    """This process's environment less the test session's settings; with ``venv`` activated
    as ``. .venv/bin/activate`` does (its ``bin`` first on PATH)."""
    env = {k: v for k, v in os.environ.items() if k not in SESSION_ONLY}
    if venv is not None:
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(venv)
    return env


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory) -> Iterator[Path]:
    """A virtual environment made by the Makefile's set-up rule, as `make demo` makes .venv (removed
    afterwards: it is about 2 GB)."""
    if shutil.which("make") is None:
        pytest.skip("no `make` on this machine: the README's two commands need it")
    python3 = shutil.which("python3")
    if python3 is None or subprocess.run([python3, "-c", "import venv, ensurepip"], capture_output=True).returncode:
        pytest.skip("`python3 -m venv` cannot make an environment here (no python3, or no venv/ensurepip module), "
                    "which the README names as the one prerequisite")
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    try:
        # The set-up rule's own target with the Makefile's VENV pointed at a new folder: the rule as `make demo` runs it.
        setup = subprocess.run(["make", f"VENV={venv}", f"{venv}/.specformer-installed"], cwd=pc.REPO,
                               env=user_environment(), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                               timeout=1800)
        output = setup.stdout + setup.stderr
        # Without network the set-up cannot run: skipped. A package that pip reached and could not install fails.
        if setup.returncode != 0 and not pip_reaches_its_index(venv / "bin" / "python" if venv.exists() else python3):
            pytest.skip(f"pip cannot reach its package index here, so the set-up cannot run:\n{_tail(output)}")
        assert setup.returncode == 0, f"the Makefile's set-up failed (exit {setup.returncode}):\n{_tail(output)}"
        assert (venv / "bin" / "specformer").is_file(), f"the set-up made no specformer script:\n{_tail(output)}"
        yield venv
    finally:
        shutil.rmtree(venv, ignore_errors=True)


def pip_reaches_its_index(python: str | Path, env: dict[str, str] | None = None) -> bool:
    """Whether pip, as this machine configures it, reads a package's versions from its index,
    not from its cache (pip's own messages for an unreachable index depend on its retry settings)."""
    probe = subprocess.run([str(python), "-m", "pip", "--no-cache-dir", "--disable-pip-version-check", "index",
                            "versions", "pip"], env=user_environment() if env is None else env,
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    return probe.returncode == 0


def _tail(output: str, lines: int = 60) -> str:
    # pip repeats a warning per index location on some machines (local mirrors): the failure is at the end.
    return "\n".join(output.splitlines()[-lines:])


@pytest.fixture(scope="module")
def fresh_results(fresh_venv, tmp_path_factory) -> dict[str, dict]:
    """Every runnable command of the two pages, run in the fresh environment, by command id."""
    env = user_environment(fresh_venv)
    assert shutil.which("specformer", path=env["PATH"]) == str(fresh_venv / "bin" / "specformer")
    runs = pc.Runs(PRINTED, tmp_path_factory.mktemp("fresh-commands"), {}, python=str(fresh_venv / "bin" / "python"),
                   environ=env, script="specformer")
    try:
        return runs.results()
    finally:
        runs.stop()


@pytest.mark.slow
def test_pip_check_passes_in_the_fresh_environment(fresh_venv):
    """No installed package's requirement is missing or conflicting (an extra pinning against another)."""
    check = subprocess.run([str(fresh_venv / "bin" / "python"), "-m", "pip", "check"], env=user_environment(fresh_venv),
                           capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, f"pip check in the fresh environment:\n{check.stdout}{check.stderr}"


@pytest.mark.slow
@pytest.mark.parametrize("command", PRINTED, ids=[c.id for c in PRINTED])
def test_first_hour_command_works_in_a_fresh_environment(command: pc.Printed, fresh_results):
    reason = pc.skip_reason(command.text)
    if reason:
        pytest.skip(reason)
    pc.check(command, fresh_results[command.id])


@pytest.mark.slow
def test_the_demo_prints_a_generate_command_that_works_in_a_fresh_environment(fresh_results):
    # Results are by command id: the two pages' demos print the same hint, which counts once.
    hints = [r for r in fresh_results.values() if r["hint_of"] and r["hint_of"].endswith(DEMO)]
    assert [r["argv"][:2] for r in hints] == [["generate", "runs/tiny/model.safetensors"]], hints
    failed = pc.failed_hints(fresh_results)
    assert not failed, "\n\n".join(failed)



def test_make_demo_runs_as_its_recipe_and_make_test_stays_skipped():
    """The stand-in for `make demo` is read from the Makefile, so a changed recipe changes what runs."""
    assert pc.make_recipe("demo") == [DEMO]
    texts = [c.text for c in PRINTED]
    assert "make demo" not in texts
    assert "make test" in texts and pc.make_recipe("test") is None and pc.skip_reason("make test")
    for source in SOURCES:  # first on each page: the commands after it use the runs/tiny/ it leaves
        runnable = [c.text for c in PRINTED if c.source.startswith(f"{source}:") and not pc.skip_reason(c.text)]
        assert runnable[0] == DEMO, runnable


def test_a_make_target_is_expanded_only_into_specformer_commands(tmp_path):
    makefile = tmp_path / "Makefile"
    makefile.write_text("VENV ?= .venv\n\ndemo: $(STAMP)\n\t$(VENV)/bin/specformer train a.yaml --overwrite  # why\n"
                        "\t@echo done\n\t@$(VENV)/bin/specformer generate m.safetensors\n\n"
                        "test: $(STAMP)\n\t$(PY) -m pytest -q\n")
    assert pc.make_recipe("demo", makefile) == ["specformer train a.yaml --overwrite",
                                                "specformer generate m.safetensors"]
    assert pc.make_recipe("test", makefile) is None and pc.make_recipe("docs", makefile) is None
    printed = [pc.Printed(source="P.md:3", text="make demo"), pc.Printed(source="P.md:4", text="make test")]
    assert [(c.source, c.text) for c in pc.expand_make(printed, makefile)] == [
        ("P.md:3", "specformer train a.yaml --overwrite"), ("P.md:3", "specformer generate m.safetensors"),
        ("P.md:4", "make test")]


@pytest.mark.slow
def test_an_unreachable_index_is_told_apart_from_a_reachable_one(tmp_path):
    """The skip of the set-up: pip pointed at an index nobody listens on (a port just freed) cannot
    reach it; pointed at a local one (a folder, no network needed) it can."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    (tmp_path / "simple" / "pip").mkdir(parents=True)
    (tmp_path / "simple" / "pip" / "index.html").write_text('<a href="pip-99.0-py3-none-any.whl">pip-99.0</a>\n')
    python3 = shutil.which("python3") or "python3"
    only_index = {**user_environment(), "PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": "", "PIP_RETRIES": "0",
                  "PIP_EXTRA_INDEX_URL": ""}
    assert not pip_reaches_its_index(python3, {**only_index, "PIP_INDEX_URL": f"http://127.0.0.1:{port}/simple"})
    assert pip_reaches_its_index(python3, {**only_index, "PIP_INDEX_URL": (tmp_path / "simple").as_uri()})
