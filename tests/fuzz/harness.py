"""The fuzzing layer's invariant, shared by every target in ``tests/fuzz``.

Every generated case runs inside its own temporary directory (the working directory,
``HOME`` and Python's temporary directory all point into it) and must end in success
or one clear user error:

- Python: a :class:`~specformer.errors.UserError` (``SpecError``, ``CheckpointError``,
  ``InputError``, ``MemoryLimitError``) or a ``ValueError`` with a message; any other
  exception fails the case;
- CLI (run in-process through ``specformer.cli.main``): exit 0 or 2, and no
  ``Traceback`` on stderr;
- within :data:`TIME_LIMIT_S` (``signal.alarm``: a hang fails the case instead of the
  run), with the memory guard set to :data:`MEMORY_LIMIT` and the process' peak
  resident memory growing by less than :data:`RSS_GROWTH_LIMIT`;
- nothing outside the case's directory changes: a sentinel folder beside it keeps its
  files, the temporary ``HOME`` gains nothing but caches (:data:`HOME_CACHES`), and no file named like the case's files
  (every name the fuzzers make starts with ``fz-``) appears in the repository.

Settings: :data:`FAST` (the default suite: a few derandomized cases, no example
database) and :data:`SLOW` (``-m slow``: 1000 cases per target).
"""

from __future__ import annotations

import contextlib
import io
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from hypothesis import HealthCheck, Phase, settings

from specformer.errors import UserError

REPO = Path(__file__).resolve().parents[2]
#: Seconds one case may take: every input here is tiny, so a hang or a huge allocation shows as far more.
TIME_LIMIT_S = 60
#: The memory guard's limit while a case runs (SPECFORMER_MAX_MEMORY): larger models must be refused.
MEMORY_LIMIT = "64M"
#: Growth of the process' peak resident memory one case may cause.
RSS_GROWTH_LIMIT = 1 << 30
#: Every file or folder a fuzzer names starts with this, so a stray write into the repository is recognisable.
PREFIX = "fz-"
#: What may appear in a case's HOME: the training token cache (docs/training.md) and matplotlib's font cache.
HOME_CACHES = (".cache/specformer", ".cache/matplotlib", ".config/matplotlib")

# No explain phase: it reruns a failing case hundreds of times (minutes here) to annotate lines.
FAST = settings(max_examples=20, deadline=None, derandomize=True, database=None, print_blob=False,
                phases=[Phase.explicit, Phase.generate, Phase.shrink],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])
SLOW = settings(FAST, max_examples=1000)


@dataclass
class Case:
    """One case's world: ``work`` is the working directory, ``home`` is ``HOME``; both inside ``root``."""

    root: Path
    work: Path
    home: Path


@contextlib.contextmanager
def bounded(limit_s: int = TIME_LIMIT_S) -> Iterator[None]:
    """Raise TimeoutError in the case (not a hang of the whole run) once ``limit_s`` seconds pass."""
    def expire(*_: Any) -> None:
        raise TimeoutError(f"the case ran past {limit_s} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(limit_s)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` with its size and modification time."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in root.rglob("*") if p.is_file() or p.is_dir()}


def repo_entries() -> set[str]:
    """Paths in the repository (outside .git and .venv) whose name starts with :data:`PREFIX`.

    Not a diff of ``git status``: people edit the working tree while the suite runs, and
    a stray write from a case is recognisable by its name alone (``.safetensors`` files
    and ``runs/`` are git-ignored, so ``git status`` would not list them either).
    """
    found = set()
    for folder, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in (".git", ".venv", "node_modules")]
        found.update(os.path.join(folder, n) for n in dirs + files if n.startswith(PREFIX))
    return found


@contextlib.contextmanager
def case_dir(outside: Path) -> Iterator[Case]:
    """A fresh case directory; on exit, check that nothing outside it changed (``outside`` is the sentinel)."""
    before_outside = snapshot(outside)
    before_repo = repo_entries()
    previous_cwd, previous_tmp = os.getcwd(), tempfile.tempdir
    saved_env = {k: os.environ.get(k) for k in ("HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "TMPDIR", "SPECFORMER_MAX_MEMORY")}
    root = Path(tempfile.mkdtemp(prefix=PREFIX, dir=outside.parent))
    case = Case(root=root, work=root / "work", home=root / "home")
    for d in (case.work, case.home, root / "tmp"):
        d.mkdir()
    try:
        os.environ.update(HOME=str(case.home), XDG_CACHE_HOME=str(case.home / ".cache"),
                          XDG_CONFIG_HOME=str(case.home / ".config"), TMPDIR=str(root / "tmp"),
                          SPECFORMER_MAX_MEMORY=MEMORY_LIMIT)
        tempfile.tempdir = str(root / "tmp")
        os.chdir(case.work)
        yield case
        unexpected = [p for p in snapshot(case.home) if not p.startswith(HOME_CACHES) and p not in (".cache", ".config")]
        assert not unexpected, f"the case wrote into HOME: {unexpected}"
    finally:
        os.chdir(previous_cwd)
        tempfile.tempdir = previous_tmp
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(root, ignore_errors=True)
    assert snapshot(outside) == before_outside, "a file outside the case's directory changed"
    stray = sorted(repo_entries() - before_repo)
    assert not stray, f"the case wrote into the repository: {stray}"


def outcome(result: Any) -> str:
    """A case's result as a label for hypothesis' statistics (``--hypothesis-show-statistics``)."""
    return type(result).__name__ if isinstance(result, BaseException) else "ok"


def expect_user_error(call: Callable[[], Any], *, allowed: tuple[type[BaseException], ...] = ()) -> Any:
    """Run ``call`` within the bounds; return its result, or the UserError/ValueError it raised (with a message)."""
    before = peak_rss_bytes()
    try:
        with bounded():
            result = call()
    except (UserError, ValueError, *allowed) as exc:
        assert str(exc).strip(), f"{type(exc).__name__} without a message"
        assert len(str(exc)) < 20_000, "an error message quoting far too much of the input"
        result = exc
    assert peak_rss_bytes() - before < RSS_GROWTH_LIMIT, "the case grew the peak memory by more than 1 GiB"
    return result


@dataclass
class CliResult:
    code: int
    out: str
    err: str


def run_cli(argv: Sequence[str]) -> CliResult:
    """``specformer ARGV`` in this process: exit 0 or 2, no traceback, within the bounds."""
    from specformer.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    before = peak_rss_bytes()
    with bounded(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), _empty_stdin():
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse: --help (0) or a bad flag (2)
            code = exc.code if isinstance(exc.code, int) else 2
    result = CliResult(code, out.getvalue(), err.getvalue())
    assert "Traceback" not in result.err, f"specformer {list(argv)!r} printed a traceback:\n{result.err[-3000:]}"
    assert result.code in (0, 2), f"specformer {list(argv)!r} exited {result.code}:\n{result.err[-3000:]}"
    if result.code == 2:
        assert result.err.strip(), f"specformer {list(argv)!r} exited 2 without saying why"
    assert peak_rss_bytes() - before < RSS_GROWTH_LIMIT, "the case grew the peak memory by more than 1 GiB"
    return result


@contextlib.contextmanager
def _empty_stdin() -> Iterator[None]:
    """stdin at its end, as ``specformer ... < /dev/null`` (``--prompt-file -`` and chat read it)."""
    previous = sys.stdin
    sys.stdin = io.StringIO("")
    try:
        yield
    finally:
        sys.stdin = previous


def run_cli_subprocess(argv: Sequence[str], *, cwd: Path, address_space: int = 8 << 30, timeout: int = 120) -> CliResult:
    """``specformer ARGV`` in a child whose address space is capped (RLIMIT_AS): for the few cases worth it."""
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    env = dict(os.environ, SPECFORMER_MAX_MEMORY=MEMORY_LIMIT, HOME=str(cwd), PYTHONFAULTHANDLER="")
    proc = subprocess.run([sys.executable, "-m", "specformer.cli", *argv], cwd=cwd, env=env, capture_output=True,
                          stdin=subprocess.DEVNULL,
                          text=True, timeout=timeout, preexec_fn=cap, check=False)
    result = CliResult(proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in result.err, f"specformer {list(argv)!r} printed a traceback:\n{result.err[-3000:]}"
    assert result.code in (0, 2), f"specformer {list(argv)!r} exited {result.code}:\n{result.err[-3000:]}"
    return result


def load_sibling_tests(relative: str, name: str) -> Any:
    """Another test module of this suite, by path (to reuse its strategies without copying them)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "tests" / relative)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sentinel(tmp_path_factory: Any, name: str) -> Path:
    """A folder beside every case's folder whose files must never change (see :func:`case_dir`)."""
    outside = tmp_path_factory.mktemp(name) / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("must stay as it is\n")
    return outside
