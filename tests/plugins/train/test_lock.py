"""The run-directory lock: one run at a time, released however a run ends, stale locks taken over."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specformer.cli.main import main
from specformer_train import lock as lock_module
from specformer_train.lock import LOCK_FILE, RunLock, RunLocked

# Holds the lock of argv[1] until killed, after printing "locked".
HOLDER = r"""
import sys, time
from specformer_train.lock import RunLock
with RunLock(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(120)
"""


def dead_pid() -> int:
    """The PID of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def start_holder(run_dir: Path) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    return holder


def test_the_lock_file_names_its_owner_and_goes_away_however_the_run_ends(tmp_path: Path) -> None:
    with RunLock(tmp_path / "run") as held:
        owner = json.loads(held.path.read_text())
        assert owner["pid"] == os.getpid() and owner["host"] == socket.gethostname()
    assert not (tmp_path / "run" / LOCK_FILE).exists()
    for error in (ValueError("boom"), KeyboardInterrupt()):
        with pytest.raises(type(error)):
            with RunLock(tmp_path / "run"):
                raise error
        assert not (tmp_path / "run" / LOCK_FILE).exists()


def test_a_second_run_is_refused_while_the_first_lives_and_takes_over_once_it_is_killed(
        tmp_path: Path, spec_file: Path, capsys: pytest.CaptureFixture) -> None:
    run_dir = tmp_path / "run"
    holder = start_holder(run_dir)
    try:
        code = main(["train", str(spec_file), "--out", str(run_dir), "--steps", "2"])
        err = capsys.readouterr().err
        assert code == 2 and "Traceback" not in err
        assert f"is in use by another training run (PID {holder.pid} on {socket.gethostname()}" in err
        assert "--out DIR" in err and len(err.strip().splitlines()) == 1
        assert not (run_dir / "checkpoints").exists() and not (run_dir / "metrics.jsonl").exists()
    finally:
        holder.kill()
        holder.wait()
    # SIGKILL leaves the file behind; the kernel has dropped the flock, so the lock is stale.
    assert json.loads((run_dir / LOCK_FILE).read_text())["pid"] == holder.pid
    code = main(["train", str(spec_file), "--out", str(run_dir), "--steps", "2", "--set", "train.eval_every=0"])
    out = capsys.readouterr().out
    assert code == 0
    assert f"was left by run PID {holder.pid} on {socket.gethostname()}" in out and "taking it over" in out
    assert not (run_dir / LOCK_FILE).exists()


def test_in_process_a_second_lock_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    with RunLock(tmp_path):
        with pytest.raises(RunLocked, match=f"PID {os.getpid()}"):
            RunLock(tmp_path).acquire()
    RunLock(tmp_path).acquire()  # free again


def test_without_flock_a_dead_pid_on_this_host_is_stale_and_anything_else_is_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lock_module, "fcntl", None)
    path = tmp_path / LOCK_FILE
    notes: list[str] = []
    path.write_text(json.dumps({"pid": dead_pid(), "host": socket.gethostname()}))
    with RunLock(tmp_path, say=notes.append):
        assert json.loads(path.read_text())["pid"] == os.getpid()
    assert len(notes) == 1 and "no longer running; taking it over" in notes[0]
    for owner in ({"pid": os.getppid(), "host": socket.gethostname()},  # alive
                  {"pid": dead_pid(), "host": "some-other-host"}):      # cannot be checked from here
        path.write_text(json.dumps(owner))
        with pytest.raises(RunLocked, match="is in use by another training run"):
            RunLock(tmp_path).acquire()
        assert json.loads(path.read_text()) == owner, "a refused lock is left as it was"


def test_a_run_directory_that_cannot_be_written_is_refused_before_any_work(tmp_path: Path, spec_file: Path,
                                                                          capsys: pytest.CaptureFixture) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    started = time.perf_counter()
    code = main(["train", str(spec_file), "--out", str(blocker / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"cannot write to the run directory {blocker / 'run'}: Not a directory" in err
    assert time.perf_counter() - started < 30  # refused at once, not after training


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_run_directory_is_refused(tmp_path: Path, spec_file: Path, capsys: pytest.CaptureFixture) -> None:
    run_dir = tmp_path / "ro"
    run_dir.mkdir()
    run_dir.chmod(0o500)
    try:
        assert main(["train", str(spec_file), "--out", str(run_dir)]) == 2
        assert "cannot write to the run directory" in capsys.readouterr().err
    finally:
        run_dir.chmod(0o700)
