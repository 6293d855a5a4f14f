"""Writing files so that a crash never leaves a half-written file where a good one was.

Every file a command writes goes to a temporary sibling first (its name unique to the
process: PID plus random hex, so two processes never share one), is flushed to disk,
and is then renamed over the target, which POSIX makes atomic. A failure removes the
temporary and leaves the target as it was.

A file written this way gets the permission bits any new file gets (``0o666`` less the
umask), whatever the code that filled the temporary did: safetensors, for one, writes
its files ``0600``. Which files a command may write at all is :mod:`specformer.files.outputs`.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def unique_suffix() -> str:
    """``<pid>-<8 hex digits>``: no two processes (or two calls) share a temporary name."""
    return f"{os.getpid()}-{secrets.token_hex(4)}"


def temp_sibling(path: Path, *, kind: str = "tmp") -> Path:
    """``.<name>.<kind>-<pid>-<random>`` beside ``path``."""
    return path.with_name(f".{path.name}.{kind}-{unique_suffix()}")


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """Yield an empty temporary sibling of ``path`` to fill; when the block ends normally it becomes ``path``.

    The temporary is flushed to disk, given the permission bits of a new file, and renamed
    over ``path``. If the block raises, the temporary is removed and ``path`` is as it was.
    """
    path = Path(path)
    tmp = temp_sibling(path)
    # The mode a new file gets is asked of the kernel, by creating the temporary here, rather than
    # computed from os.umask(): reading the umask means setting it, for a moment, for every thread
    # of the process, so another thread's file created then would get the wrong bits. A folder's
    # default ACL, where there is one, is honoured the same way.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        mode = os.fstat(fd).st_mode & 0o7777
    finally:
        os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, mode)  # the writer may have replaced the file (safetensors writes 0600 files)
        fsync_file(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            tmp.unlink()


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary sibling, flush it to disk, and rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)


def copy_file_atomic(source: Path, path: Path) -> None:
    """Copy ``source`` to ``path`` through a flushed temporary sibling."""
    with replacing(Path(path)) as tmp:
        shutil.copyfile(source, tmp)


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


__all__ = ["copy_file_atomic", "fsync_dir", "fsync_file", "replacing", "temp_sibling", "unique_suffix",
           "write_text_atomic"]
