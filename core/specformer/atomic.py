"""Writing files so that a crash never leaves a half-written file where a good one was.

Every file a command writes goes to a temporary sibling first (its name unique to the
process: PID plus random hex, so two processes never share one), is flushed to disk,
and is then renamed over the target, which POSIX makes atomic. A failure removes the
temporary and leaves the target as it was.
"""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

def unique_suffix() -> str:
    """``<pid>-<8 hex digits>``: no two processes (or two calls) share a temporary name."""
    return f"{os.getpid()}-{secrets.token_hex(4)}"


def temp_sibling(path: Path, *, kind: str = "tmp") -> Path:
    """``.<name>.<kind>-<pid>-<random>`` beside ``path``."""
    return path.with_name(f".{path.name}.{kind}-{unique_suffix()}")


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary sibling, flush it to disk, and rename it over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(path)
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def copy_file_atomic(source: Path, path: Path) -> None:
    """Copy ``source`` to ``path`` through a flushed temporary sibling."""
    tmp = temp_sibling(path)
    try:
        shutil.copyfile(source, tmp)
        fsync_file(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    """Make renames inside ``path`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems do not fsync folders; the rename itself is still atomic
    finally:
        os.close(fd)
