"""Writing what import and export produce: checked before the work, then complete or not at all.

An export folder is written into a temporary sibling (same parent, so the final rename
stays on one file system) and renamed into place only once every file is in it. A
folder that already holds files is replaced only when asked (``force``), and only after
the new one is complete: the old one is moved aside, the new one renamed in, and the old
one deleted last. So an interrupted export leaves either the previous folder or the new
one, never a mixture of two models' shards and tokenizers.

A single output file is written to a temporary sibling and renamed over the target
(``os.replace`` is atomic), and an existing file is only replaced with ``force``.

Every check that can be made up front (the parent folder exists and can be written, the
target is not already there) is made before any weights are converted.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from specformer import atomic
from specformer.errors import UserError


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def _probe_writable(folder: Path, target: Path) -> None:
    """UserError unless a file can be created in ``folder`` (tried for real: root ignores permission bits,
    and a read-only mount is not visible in them)."""
    if not folder.is_dir():
        raise UserError(f"{target}: the folder {folder} does not exist; create it first")
    probe = folder / f".{target.name}.probe-{atomic.unique_suffix()}"
    try:
        probe.mkdir()
    except OSError as exc:
        raise UserError(f"{target}: cannot write in {folder} ({_reason(exc)})") from None
    probe.rmdir()


def check_file_target(path: Path, *, force: bool) -> None:
    """UserError unless ``path`` can be written: its folder exists and is writable, and it is not
    already a file (unless ``force``) or a folder."""
    if path.is_dir():
        raise UserError(f"{path}: is a folder; give a file name")
    if path.exists() and not force:
        raise UserError(f"{path}: already exists; pass --force to replace it")
    _probe_writable(path.parent, path)


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a uniquely named temporary sibling renamed into place."""
    try:
        atomic.write_text_atomic(path, text)
    except OSError as exc:
        raise UserError(f"{path}: could not be written ({_reason(exc)}); nothing was changed") from None


def check_directory_target(path: Path, *, force: bool) -> None:
    """UserError unless ``path`` can become an export folder: absent, empty, or (with ``force``) one to replace."""
    if path.is_symlink():
        raise UserError(f"{path}: is a symbolic link; give the folder it points to, or a new name")
    if path.exists() and not path.is_dir():
        raise UserError(f"{path}: exists and is not a folder")
    if path.is_dir() and any(path.iterdir()):
        if not force:
            raise UserError(
                f"{path}: already holds files (an export there would mix two models); choose a new or empty "
                "folder, or pass --force to replace this one"
            )
        here = Path.cwd().resolve()
        if path.resolve() == here or path.resolve() in here.parents:
            raise UserError(f"{path}: is the current folder or one above it; --force will not replace it")
    _probe_writable(path.parent, path)


@contextmanager
def staged_directory(path: Path, *, force: bool) -> Iterator[Path]:
    """Yield an empty temporary sibling of ``path`` to write into; on success it becomes ``path``.

    On an error inside the block the sibling is deleted and ``path`` is left as it was.
    """
    check_directory_target(path, force=force)
    stage = path.with_name(f".{path.name}.partial-{atomic.unique_suffix()}")
    try:
        stage.mkdir()  # not mkdtemp: its 0700 mode would end up on the export
    except OSError as exc:
        raise UserError(f"{path}: cannot write in {path.parent} ({_reason(exc)})") from None
    try:
        try:
            yield stage
        except OSError as exc:
            raise UserError(f"{path}: could not write the export ({_reason(exc)}); nothing was changed") from None
        _commit(stage, path, force=force)
    finally:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)


def _commit(stage: Path, path: Path, *, force: bool) -> None:
    """Rename the complete ``stage`` to ``path``; an old folder there is moved aside first and deleted last."""
    check_directory_target(path, force=force)  # again: something may have appeared there meanwhile
    old = None
    if path.is_dir() and any(path.iterdir()):
        old = path.with_name(f".{path.name}.old-{atomic.unique_suffix()}")
        os.rename(path, old)
    elif path.is_dir():
        path.rmdir()  # empty: renaming onto it is not portable
    try:
        os.rename(stage, path)
    except OSError as exc:
        if old is not None:
            os.rename(old, path)  # put the previous export back
        raise UserError(f"{path}: could not move the export into place ({_reason(exc)}); nothing was changed") from None
    atomic.fsync_dir(path.parent)  # the renames are durable only once the folder's entries are
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


__all__ = ["check_directory_target", "check_file_target", "staged_directory", "write_text_atomic"]
