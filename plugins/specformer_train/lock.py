"""One run at a time in a run directory: ``<out_dir>/run.lock``.

Two ``specformer train`` processes writing the same run directory would interleave
checkpoints and metrics silently, so a run holds ``run.lock`` from before it reads any
data until it exits. The file holds the owner's PID, host and start time as JSON (for
the message a second run prints), and the owner holds an exclusive ``flock`` on it: the
kernel drops that lock when the process dies, however it dies, so a lock left behind by
a killed run is recognised as stale at once and taken over with a note. Where the file
system has no ``flock`` (some network mounts), a lock written on this host whose PID is
no longer alive counts as stale; one written on another host is never taken over.

The file is removed when the run ends: normally, by an exception, or by Ctrl-C.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Callable

from specformer.errors import UserError

LOCK_FILE = "run.lock"

try:
    import fcntl
except ImportError:  # Windows: PID-based detection only
    fcntl = None  # type: ignore[assignment]


class RunLocked(UserError):
    """Another live run holds the run directory."""


class RunLock:
    """``with RunLock(run_dir): ...`` holds ``run_dir/run.lock`` for the duration of a run."""

    def __init__(self, run_dir: str | Path, *, say: Callable[[str], None] = print) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._say = say
        self._fd: int | None = None

    def __enter__(self) -> "RunLock":
        self.acquire()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()

    def acquire(self) -> None:
        """Take the lock or raise :class:`RunLocked` (another live run) / :class:`UserError` (cannot write)."""
        for _ in range(10):  # retried only when the file is replaced under us between open and lock
            fd = self._open()
            try:
                previous = _read_owner(fd)
                if not self._lock(fd, previous):
                    raise RunLocked(_held_message(self.path, previous))
                # Locked; but the file may have been removed (and another created) since we opened it.
                if not _same_file(fd, self.path):
                    os.close(fd)
                    continue
                if previous and previous.get("pid") != os.getpid():
                    self._say(f"note: {self.path} was left by run {_who(previous)}, which is no longer running; "
                              "taking it over")
                _write_owner(fd)
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
            return
        raise UserError(f"{self.path}: the lock file keeps being replaced by another process; try again")

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            # Removed while still locked, so no other process can lock this file after we let go.
            if _same_file(self._fd, self.path):
                self.path.unlink()
        except OSError:
            pass
        finally:
            os.close(self._fd)
            self._fd = None

    def _open(self) -> int:
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise UserError(f"cannot write to the run directory {self.run_dir}: {exc.strerror or exc}; "
                            "choose another with --out DIR") from None

    def _lock(self, fd: int, previous: dict[str, Any] | None) -> bool:
        """True when this process now owns the lock."""
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                return False
            except OSError as exc:
                if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                    raise
        # No flock here: judge the owner by its PID (only possible on the same host).
        return previous is None or not _alive(previous)


def _read_owner(fd: int) -> dict[str, Any] | None:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 4096)
    if not raw.strip():
        return None
    try:
        owner = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {"pid": None, "host": "?"}  # a torn write: its writer died mid-write
    return owner if isinstance(owner, dict) else {"pid": None, "host": "?"}


def _write_owner(fd: int) -> None:
    owner = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    data = json.dumps(owner).encode("utf-8")
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, data)
    os.fsync(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        here, there = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _alive(owner: dict[str, Any]) -> bool:
    """Whether the owner may still be running: true unless it is a PID on this host that no longer exists."""
    pid = owner.get("pid")
    if owner.get("host") != socket.gethostname() or not isinstance(pid, int) or isinstance(pid, bool):
        return True
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def _who(owner: dict[str, Any]) -> str:
    started = f", started {owner['started']}" if owner.get("started") else ""
    return f"PID {owner.get('pid')} on {owner.get('host')}{started}"


def _held_message(path: Path, owner: dict[str, Any] | None) -> str:
    who = _who(owner) if owner else "another process"
    return (f"{path.parent} is in use by another training run ({who}); wait for it to finish, stop it, "
            f"or train into another directory with --out DIR (if no such run exists, delete {path})")
