"""Finding the training corpus: which files, and the documents in them.

``--data`` names a file, a directory (searched recursively) or a glob of document files
(``.txt``, ``.md``, ``.py``: one document per file; ``.jsonl``/``.json``, ``.parquet``,
``.arrow``: one document per record, its text field; a directory ``datasets`` saved with
``save_to_disk``: one document per row; see :mod:`specformer_text.sources`), or one
already tokenized array (``.bin``: raw uint16 token ids as nanoGPT writes them, uint32
when the vocabulary needs it; ``.npy``: any integer dtype).

Without ``--data`` the corpus is the Python standard library's own ``.py`` source,
which every machine that runs Python has: tests and IDLE are left out, files that are
not UTF-8 are skipped, and at most :data:`DEFAULT_CORPUS_BYTES` are taken, in an order
fixed by a hash of each file's path (so the corpus is a spread of modules, the same on
every run of the same Python).
"""

from __future__ import annotations

import glob
import hashlib
import os
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from specformer.errors import UserError

from specformer_text.sources import (RECORD_SUFFIXES, TEXT_SUFFIXES, check_readable, is_saved_dataset,
                                      read_documents, read_text)

TOKEN_SUFFIXES = (".bin", ".npy")
DOCUMENT_SUFFIXES = (*TEXT_SUFFIXES, *RECORD_SUFFIXES)
ACCEPTED = ", ".join((*DOCUMENT_SUFFIXES, *TOKEN_SUFFIXES)) + ", a datasets save_to_disk directory"

#: The default corpus stops after this many bytes of source, so the demo tokenizes in a blink.
DEFAULT_CORPUS_BYTES = 4_000_000
_STDLIB_SKIP = {"test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__", "lib2to3", "turtledemo"}


@dataclass
class Corpus:
    """The files a run reads: document files (or saved datasets directories) or one tokenized array."""

    description: str
    files: list[Path] = field(default_factory=list)  # in reading order (sorted)
    tokenized: Path | None = None
    total_bytes: int = 0
    text_field: str = "text"  # the records' text field (.jsonl, .json, .parquet, .arrow, datasets)

    def fingerprint(self) -> str:
        """Changes when any file is added, removed, resized or touched (path, size, mtime), or the text field
        of record files changes."""
        h = hashlib.sha256()
        for path in [*self.files, *([self.tokenized] if self.tokenized else [])]:
            for member in _members(path):
                stat = member.stat()
                h.update(f"{member.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
        if any(p.is_dir() or p.suffix in RECORD_SUFFIXES for p in self.files):
            h.update(f"field\0{self.text_field}".encode())
        return h.hexdigest()

    def documents(self) -> Iterator[str]:
        """Each document's text, in order; a file that cannot be read is a :class:`UserError`."""
        for path in self.files:
            yield from read_documents(path, text_field=self.text_field)


def find_corpus(data: str | None, *, text_field: str = "text") -> Corpus:
    """The corpus ``data`` names (see the module doc), or the standard library's source when None."""
    if data is None:
        return default_corpus()
    paths = _expand(data)
    tokenized = [p for p in paths if p.suffix in TOKEN_SUFFIXES and not p.is_dir()]
    texts = [p for p in paths if p.is_dir() or p.suffix in DOCUMENT_SUFFIXES]
    if tokenized:
        if len(tokenized) > 1 or texts:
            raise UserError(
                f"--data {data!r}: a tokenized array (.bin/.npy) must be the only input, found "
                f"{len(tokenized)} arrays and {len(texts)} text files"
            )
        return Corpus(description=str(tokenized[0]), tokenized=tokenized[0], total_bytes=tokenized[0].stat().st_size)
    if not texts:
        raise UserError(f"--data {data!r}: no usable files found; accepted file types: {ACCEPTED}")
    total = sum(member.stat().st_size for p in texts for member in _members(p))
    if total == 0:
        raise UserError(f"--data {data!r}: the corpus is empty ({len(texts)} files, all of size 0)")
    for path in texts:
        check_readable(path, text_field=text_field)  # columnar files: the field exists, the file opens
    what = str(texts[0]) if len(texts) == 1 else f"{data} ({len(texts)} files)"
    return Corpus(description=what, files=texts, total_bytes=total, text_field=text_field)


def default_corpus(max_bytes: int = DEFAULT_CORPUS_BYTES) -> Corpus:
    """Up to ``max_bytes`` of the Python standard library's ``.py`` files (see the module doc)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    candidates = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _STDLIB_SKIP and not d.startswith("."))
        for name in filenames:
            if name.endswith(".py"):
                candidates.append(Path(dirpath) / name)
    candidates.sort(key=lambda p: hashlib.sha1(str(p.relative_to(root)).encode()).hexdigest())
    chosen, total = [], 0
    for path in candidates:
        size = path.stat().st_size
        if size == 0 or total + size > max_bytes:
            continue
        try:
            path.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # our own choice of corpus: skip what is not plain UTF-8
        chosen.append(path)
        total += size
    if not chosen:
        raise UserError(f"no Python source found under {root} to use as the default corpus; pass --data")
    chosen.sort()
    return Corpus(
        description=f"Python {sysconfig.get_python_version()} standard library source ({len(chosen)} files)",
        files=chosen,
        total_bytes=total,
    )


def _expand(data: str) -> list[Path]:
    """The files ``data`` names: itself, every accepted file under it, or the matches of a glob."""
    path = Path(data).expanduser()
    if any(ch in data for ch in "*?["):
        matches = sorted(Path(p) for p in glob.glob(str(path), recursive=True))
        files = [p for p in matches if p.is_file() or is_saved_dataset(p)]
        if not files:
            raise UserError(f"--data {data!r}: the pattern matches no file")
        return [p for p in files if p.is_dir() or p.suffix in (*DOCUMENT_SUFFIXES, *TOKEN_SUFFIXES)] or _unaccepted(data, files)
    if not path.exists():
        raise UserError(f"--data {data!r}: no such file or directory")
    if is_saved_dataset(path):
        return [path]
    if path.is_dir():
        found = _document_files(path)
        if not found:
            raise UserError(f"--data {data!r}: the directory holds no {', '.join(DOCUMENT_SUFFIXES)} file "
                            "and no saved datasets directory")
        return found
    if path.suffix not in (*DOCUMENT_SUFFIXES, *TOKEN_SUFFIXES):
        return _unaccepted(data, [path])
    return [path]


def _document_files(root: Path) -> list[Path]:
    """Every document file under ``root``, sorted; a saved datasets directory counts as one (its own
    ``state.json`` is not a document); hidden files and folders are skipped."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        for name in sorted(dirnames):
            if name.startswith(".") or is_saved_dataset(here / name):
                dirnames.remove(name)
                if not name.startswith("."):
                    found.append(here / name)
        found += [here / name for name in filenames
                  if not name.startswith(".") and Path(name).suffix in DOCUMENT_SUFFIXES]
    return sorted(found)


def _members(path: Path) -> list[Path]:
    """The files behind one corpus entry: itself, or every file of a saved datasets directory."""
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]


def _unaccepted(data: str, files: list[Path]) -> list[Path]:
    kinds = sorted({p.suffix or "(no suffix)" for p in files})
    raise UserError(f"--data {data!r}: file type {', '.join(kinds)} is not accepted; accepted: {ACCEPTED}")
