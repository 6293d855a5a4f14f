"""What a command may write: nothing that exists unless asked, never one of its own inputs, and all or nothing.

Every command that writes a file or a folder checks the output here before any work
(``quantize -o``, ``merge -o``, ``hf import``, ``hf export``, ``hf attach-tokenizer``,
``train --out``, ``inspect --out``, ``schema -o``, ``new-plugin``), under one rule:

1. An output that already exists is replaced only with ``--force`` (an empty folder
   counts as absent). ``train`` keeps its own words for this: ``--overwrite`` or ``--resume``.
2. An output that is one of the command's inputs is refused, ``--force`` or not: the same
   path however it is spelt (``./a/../a``, a symbolic link) or the same file under
   another name (a hard link: the same device and inode). A folder that would be
   replaced is refused while any input lies inside it.
3. What is written is complete or absent: a file goes to a temporary sibling that is
   renamed over the target (:func:`specformer.files.atomic.replacing`); a folder is written
   into a staged sibling (:func:`staged_folder`) renamed into place once every file is
   in it, the old folder moved aside first and deleted last. So an interrupted command
   leaves what was there before, or the new output, never a mixture.

Checks that can be made before the work (the parent folder exists and takes a file,
nothing is in the way) are made before it, so a refusal costs nothing.
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from specformer.files import atomic
from specformer.errors import UserError

def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def _identity(path: Path) -> tuple[int, int] | None:
    """``(device, inode)`` of what ``path`` names (symbolic links followed), or None if it names nothing."""
    try:
        found = os.stat(path)
    except (OSError, ValueError):
        return None
    return found.st_dev, found.st_ino


class _Place:
    """A path as the comparisons see it: resolved, and by device and inode where it exists."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.resolved = self.path.resolve()
        self.identity = _identity(self.path)
        self.folder = self.path.is_dir()

    @functools.cached_property
    def above(self) -> set[tuple[int, int] | None]:
        """The device and inode of every folder above it (asked only when a containing folder exists)."""
        return {_identity(parent) for parent in self.resolved.parents}

    def is_(self, other: _Place) -> bool:
        return self.resolved == other.resolved or (self.identity is not None and self.identity == other.identity)

    def holds(self, other: _Place) -> bool:
        """Whether ``other`` lies inside this folder (itself excluded)."""
        if self.resolved in other.resolved.parents:
            return True
        return self.folder and self.identity is not None and self.identity in other.above


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether ``a`` and ``b`` name one file or folder: the same path once resolved, or the same device and inode."""
    return _Place(a).is_(_Place(b))


def lies_inside(path: str | os.PathLike[str], folder: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is ``folder`` or somewhere inside it.

    Compared by resolved paths, and each folder above ``path`` also by device and inode
    (a folder reached by two routes, a bind mount say, is still the same folder).
    """
    inner, outer = _Place(path), _Place(folder)
    return outer.is_(inner) or outer.holds(inner)


def refuse_inputs(outputs: Iterable[str | os.PathLike[str]], inputs: Iterable[str | os.PathLike[str] | None], *,
                  instead: str = "write to another path", flag: str = "--force") -> None:
    """Raise :class:`UserError` when an input is one of ``outputs`` or lies inside one of them.

    ``None`` among ``inputs`` stands for an input not given and is skipped. An output that
    is a folder counts as everything in it: replacing it would delete them. The message
    ends with ``instead`` (what to do) and says that ``flag`` does not change this.
    """
    targets = [_Place(output) for output in outputs]  # once each: a corpus glob may bring thousands of inputs
    for given in inputs:
        if given is None:
            continue
        source = _Place(given)
        for output in targets:
            if output.is_(source):
                what = "is also" if str(output.path) == str(source.path) else f"is {source.path} (the same file),"
                raise UserError(f"{output.path}: {what} an input of this command; {instead} ({flag} never replaces "
                                "an input)")
            if output.holds(source):
                raise UserError(f"{output.path}: holds {source.path}, an input of this command, which replacing it "
                                f"would delete; {instead} ({flag} never replaces an input)")


def _probe_writable(folder: Path, target: Path) -> None:
    """UserError unless an entry can be made in ``folder`` (tried for real: root ignores permission bits,
    and a read-only mount is not visible in them)."""
    if not folder.is_dir():
        raise UserError(f"{target}: the folder {folder} does not exist; create it first")
    probe = atomic.temp_sibling(folder / target.name, kind="probe")
    try:
        probe.mkdir()
    except OSError as exc:
        raise UserError(f"{target}: cannot write in {folder} ({_reason(exc)})") from None
    probe.rmdir()


def _nearest_folder(path: Path, target: Path) -> Path:
    """``path`` or the nearest folder above it that exists (where missing folders would be created)."""
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    if not path.is_dir():
        raise UserError(f"{target}: {path} is not a folder")
    return path


def check_file_output(path: str | os.PathLike[str], *, inputs: Iterable[str | os.PathLike[str] | None] = (),
                      force: bool) -> None:
    """Raise :class:`UserError` unless the file ``path`` may be written (the rule in the module doc).

    It must not be one of ``inputs``, nor (unless ``force``) exist already, nor be a
    folder or anything else that is not a regular file; the folder it goes in must exist
    and take a new entry.
    """
    path = Path(path)
    refuse_inputs([path], inputs)
    if path.is_dir():
        raise UserError(f"{path}: is a folder; give a file name")
    if path.exists() and not path.is_file():
        # The new file would be renamed over it: /dev/null, say, would become a plain file.
        raise UserError(f"{path}: is not a regular file (a device, pipe or socket); give a file name")
    if os.path.lexists(path) and not force:
        raise UserError(f"{path}: already exists; pass --force to replace it")
    _probe_writable(path.parent, path)


def check_folder_output(path: str | os.PathLike[str], *, inputs: Iterable[str | os.PathLike[str] | None] = (),
                        force: bool, parents: bool = False) -> None:
    """Raise :class:`UserError` unless the folder ``path`` may be written whole (the rule in the module doc).

    It must not be or hold any of ``inputs``; it must be absent, empty, or (with ``force``)
    a folder to replace, but never the current folder or one above it, nor a symbolic
    link. Its parent must exist and take a new entry, or with ``parents`` the nearest
    folder above it that exists (the missing ones are made when it is written).
    """
    path = Path(path)
    refuse_inputs([path], inputs)
    if path.is_symlink():
        raise UserError(f"{path}: is a symbolic link; give the folder it points to, or a new name")
    if path.exists() and not path.is_dir():
        raise UserError(f"{path}: exists and is not a folder")
    if path.is_dir() and any(path.iterdir()):
        if not force:
            raise UserError(f"{path}: already holds files; choose a new or empty folder, or pass --force to replace "
                            "this one")
        if lies_inside(Path.cwd(), path):
            raise UserError(f"{path}: is the current folder or one above it; --force will not replace it")
    _probe_writable(_nearest_folder(path.parent, path) if parents else path.parent, path)


@contextmanager
def writing(path: str | os.PathLike[str]) -> Iterator[None]:
    """Turn a failure to write ``path`` (disk full, permissions) into one :class:`UserError` line.

    For atomic writers (:mod:`specformer.files.atomic`, :func:`specformer.save`), whose failure
    leaves the old file in place, which the message says.
    """
    try:
        yield
    except OSError as exc:
        raise UserError(f"{path}: could not be written ({_reason(exc)}); nothing was changed") from None


def write_text_output(path: str | os.PathLike[str], text: str, *, inputs: Iterable[str | os.PathLike[str] | None] = (),
                      force: bool) -> None:
    """Check ``path`` (:func:`check_file_output`) and write ``text`` to it atomically."""
    check_file_output(path, inputs=inputs, force=force)
    with writing(path), atomic.replacing(Path(path)) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)


@contextmanager
def staged_folder(path: str | os.PathLike[str], *, inputs: Iterable[str | os.PathLike[str] | None] = (),
                  force: bool, parents: bool = False) -> Iterator[Path]:
    """Yield an empty temporary sibling of ``path`` to write into; when the block ends normally it becomes ``path``.

    ``path`` is checked first (:func:`check_folder_output`) and again just before the
    rename (something may have appeared there meanwhile). An old folder there is moved
    aside, the new one renamed in, and the old one deleted last. If the block raises,
    the sibling is deleted and ``path`` is left as it was; an ``OSError`` becomes one
    :class:`UserError` line.
    """
    path = Path(path)
    inputs = list(inputs)
    check_folder_output(path, inputs=inputs, force=force, parents=parents)
    stage = atomic.temp_sibling(path, kind="partial")
    try:
        if parents:
            path.parent.mkdir(parents=True, exist_ok=True)
        stage.mkdir()  # not mkdtemp: its 0700 mode would end up on the output; mkdir's follows the umask
    except OSError as exc:
        raise UserError(f"{path}: cannot write in {path.parent} ({_reason(exc)})") from None
    try:
        try:
            yield stage
        except OSError as exc:
            raise UserError(f"{path}: could not be written ({_reason(exc)}); nothing was changed") from None
        check_folder_output(path, inputs=inputs, force=force)
        _commit(stage, path)
    finally:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)


def _commit(stage: Path, path: Path) -> None:
    """Rename the complete ``stage`` to ``path``; an old folder there is moved aside first and deleted last."""
    old = None
    if path.is_dir() and any(path.iterdir()):
        old = atomic.temp_sibling(path, kind="old")
        os.rename(path, old)
    elif path.is_dir():
        path.rmdir()  # empty: renaming onto it is not portable
    try:
        os.rename(stage, path)
    except OSError as exc:
        if old is not None:
            os.rename(old, path)  # put the previous folder back
        raise UserError(f"{path}: could not be moved into place ({_reason(exc)}); nothing was changed") from None
    atomic.fsync_dir(path.parent)  # the renames are durable only once the folder's entries are
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


__all__ = ["check_file_output", "check_folder_output", "lies_inside", "refuse_inputs", "same_file",
           "staged_folder", "write_text_output", "writing"]
