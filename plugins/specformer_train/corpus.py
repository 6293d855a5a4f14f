"""Finding the training corpus: which files, and the documents in them.

``--data`` names a file, a directory (searched recursively) or a glob of text files
(``.txt``, ``.md``, ``.py``: one document per file; ``.jsonl``: one document per line,
its ``text`` field), or one already tokenized array (``.bin``: raw uint16 token ids as
nanoGPT writes them, uint32 when the vocabulary needs it; ``.npy``: any integer dtype).

Without ``--data`` the corpus is the Python standard library's own ``.py`` source,
which every machine that runs Python has: tests and IDLE are left out, files that are
not UTF-8 are skipped, and at most :data:`DEFAULT_CORPUS_BYTES` are taken, in an order
fixed by a hash of each file's path (so the corpus is a spread of modules, the same on
every run of the same Python).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from specformer.errors import UserError

TEXT_SUFFIXES = (".txt", ".md", ".py")
JSONL_SUFFIX = ".jsonl"
TOKEN_SUFFIXES = (".bin", ".npy")
ACCEPTED = ", ".join((*TEXT_SUFFIXES, JSONL_SUFFIX, *TOKEN_SUFFIXES))

#: The default corpus stops after this many bytes of source, so the demo tokenizes in a blink.
DEFAULT_CORPUS_BYTES = 4_000_000
_STDLIB_SKIP = {"test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__", "lib2to3", "turtledemo"}


@dataclass
class Corpus:
    """The files a run reads: either text files (documents) or one tokenized array."""

    description: str
    files: list[Path] = field(default_factory=list)
    tokenized: Path | None = None
    total_bytes: int = 0

    def fingerprint(self) -> str:
        """Changes when any file is added, removed, resized or touched (path, size, mtime)."""
        h = hashlib.sha256()
        for path in [*self.files, *([self.tokenized] if self.tokenized else [])]:
            stat = path.stat()
            h.update(f"{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
        return h.hexdigest()

    def documents(self) -> Iterator[str]:
        """Each document's text, in order; a file that cannot be read is a :class:`UserError`."""
        for path in self.files:
            if path.suffix == JSONL_SUFFIX:
                yield from _jsonl_documents(path)
            else:
                yield read_text(path)


def find_corpus(data: str | None) -> Corpus:
    """The corpus ``data`` names (see the module doc), or the standard library's source when None."""
    if data is None:
        return default_corpus()
    paths = _expand(data)
    tokenized = [p for p in paths if p.suffix in TOKEN_SUFFIXES]
    texts = [p for p in paths if p.suffix in TEXT_SUFFIXES or p.suffix == JSONL_SUFFIX]
    if tokenized:
        if len(tokenized) > 1 or texts:
            raise UserError(
                f"--data {data!r}: a tokenized array (.bin/.npy) must be the only input, found "
                f"{len(tokenized)} arrays and {len(texts)} text files"
            )
        return Corpus(description=str(tokenized[0]), tokenized=tokenized[0], total_bytes=tokenized[0].stat().st_size)
    if not texts:
        raise UserError(f"--data {data!r}: no usable files found; accepted file types: {ACCEPTED}")
    total = sum(p.stat().st_size for p in texts)
    if total == 0:
        raise UserError(f"--data {data!r}: the corpus is empty ({len(texts)} files, all of size 0)")
    what = str(texts[0]) if len(texts) == 1 else f"{data} ({len(texts)} files)"
    return Corpus(description=what, files=texts, total_bytes=total)


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


def read_text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason}); convert it or leave it out") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot be read ({exc.strerror or exc})") from None


def _jsonl_documents(path: Path) -> Iterator[str]:
    for number, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
        text = record.get("text") if isinstance(record, dict) else None
        if not isinstance(text, str):
            raise UserError(f"{path}:{number}: each line must be a JSON object with a string 'text' field")
        yield text


def _expand(data: str) -> list[Path]:
    """The files ``data`` names: itself, every accepted file under it, or the matches of a glob."""
    path = Path(data).expanduser()
    if any(ch in data for ch in "*?["):
        matches = sorted(Path(p) for p in glob.glob(str(path), recursive=True))
        files = [p for p in matches if p.is_file()]
        if not files:
            raise UserError(f"--data {data!r}: the pattern matches no file")
        return [p for p in files if p.suffix in (*TEXT_SUFFIXES, JSONL_SUFFIX, *TOKEN_SUFFIXES)] or _unaccepted(data, files)
    if not path.exists():
        raise UserError(f"--data {data!r}: no such file or directory")
    if path.is_dir():
        found = sorted(
            p for p in path.rglob("*")
            if p.is_file() and p.suffix in (*TEXT_SUFFIXES, JSONL_SUFFIX) and not any(s.startswith(".") for s in p.relative_to(path).parts)
        )
        if not found:
            raise UserError(f"--data {data!r}: the directory holds no {', '.join((*TEXT_SUFFIXES, JSONL_SUFFIX))} file")
        return found
    if path.suffix not in (*TEXT_SUFFIXES, JSONL_SUFFIX, *TOKEN_SUFFIXES):
        return _unaccepted(data, [path])
    return [path]


def _unaccepted(data: str, files: list[Path]) -> list[Path]:
    kinds = sorted({p.suffix or "(no suffix)" for p in files})
    raise UserError(f"--data {data!r}: file type {', '.join(kinds)} is not accepted; accepted: {ACCEPTED}")
