"""The tokenized corpus, cached on disk as a memory-mapped array.

Documents are tokenized once, each followed by the end-of-text token, into one flat
array of ids (by ``train.tokenize_workers`` processes for a large corpus, see
:mod:`specformer_text.tokenize_workers`; the ids are the same whatever their number). The array is stored under the cache directory keyed by a hash of the
corpus fingerprint (every file's path, size and modification time) and the tokenizer,
so a second run with the same data starts at once, and a changed file or tokenizer
tokenizes again. An entry is a ``.bin`` of raw ids plus a ``.json`` describing it,
written last: an interrupted write leaves no entry that looks complete.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from specformer.files.atomic import temp_sibling, write_text_atomic
from specformer.errors import UserError
from specformer.tokenizers.tokenizer import Tokenizer

from specformer_text.errors import OutputError
from specformer_text.corpus import Corpus
from specformer_text.tokenize_workers import choose_workers, encoded_documents

CACHE_FORMAT = "specformer-tokens/1"


def cache_dir(configured: str | None = None) -> Path:
    """``configured``, else ``$SPECFORMER_CACHE``, else ``$XDG_CACHE_HOME/specformer`` (``~/.cache``)."""
    if configured:
        return Path(configured).expanduser()
    if os.environ.get("SPECFORMER_CACHE"):
        return Path(os.environ["SPECFORMER_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "specformer"


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def tokenize_corpus(corpus: Corpus, tokenizer: Tokenizer, *, cache: str | None = None,
                    progress: bool = True, workers: int | str = "auto") -> np.ndarray:
    """The corpus as one read-only array of token ids (memory-mapped from the cache).

    ``workers`` processes tokenize it when it is not cached yet (``auto``: see
    :func:`~specformer_text.tokenize_workers.choose_workers`).
    """
    if corpus.tokenized is not None:
        return load_tokenized(corpus.tokenized, vocab_size=tokenizer.vocab_size)
    key = hashlib.sha256(f"{CACHE_FORMAT}\n{corpus.fingerprint()}\n{tokenizer.to_json()}".encode()).hexdigest()[:32]
    folder = cache_dir(cache) / "tokens"
    data_path, info_path = folder / f"{key}.bin", folder / f"{key}.json"
    dtype = token_dtype(tokenizer.vocab_size)
    cached = _read_entry(data_path, info_path, dtype)
    if cached is not None:
        return cached
    try:
        return _write_entry(corpus, tokenizer, data_path, info_path, dtype, progress=progress,
                            workers=choose_workers(workers, tokenizer=tokenizer, total_bytes=corpus.total_bytes))
    except OSError as exc:
        raise OutputError(f"could not write the token cache in {folder}: {exc.strerror or exc}; free some space "
                          "or put the cache elsewhere with train.cache_dir or $SPECFORMER_CACHE") from None


def _write_entry(corpus: Corpus, tokenizer: Tokenizer, data_path: Path, info_path: Path, dtype: np.dtype, *,
                 progress: bool, workers: int) -> np.ndarray:
    """Tokenize the corpus into a new cache entry (data first, its description last) and read it back."""
    data_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(data_path)
    count = documents = 0
    eot = np.array([tokenizer.eot_id], dtype=dtype)
    try:
        desc = "tokenizing" + (f" ({workers} processes)" if workers > 1 else "")
        with open(tmp, "wb") as out, tqdm(total=corpus.total_bytes, unit="B", unit_scale=True, desc=desc,
                                          disable=not progress or corpus.total_bytes < 20_000_000, leave=False) as bar:
            for ids, characters in encoded_documents(corpus.documents(), tokenizer, dtype=dtype, workers=workers):
                out.write(ids.tobytes())
                out.write(eot.tobytes())
                count += len(ids) + 1
                documents += 1
                bar.update(characters)
            out.flush()
            os.fsync(out.fileno())
        if documents == 0:  # e.g. Parquet files without rows: nothing to train on, and no entry to keep
            raise UserError(f"{corpus.description}: the corpus holds no document (every file has no records)")
        os.replace(tmp, data_path)
    finally:
        if tmp.exists():
            tmp.unlink()
    info = {"format": CACHE_FORMAT, "tokens": count, "documents": documents, "dtype": dtype.name,
            "corpus": corpus.description, "tokenizer": json.loads(tokenizer.to_json()).get("kind")}
    write_text_atomic(info_path, json.dumps(info))
    loaded = _read_entry(data_path, info_path, dtype)
    assert loaded is not None
    return loaded


def load_tokenized(path: Path, *, vocab_size: int) -> np.ndarray:
    """An already tokenized ``.npy`` (any integer dtype) or ``.bin`` (uint16, uint32 past 65,536 ids)."""
    try:
        if path.suffix == ".npy":
            tokens = np.load(path, mmap_mode="r")
        else:
            tokens = np.memmap(path, dtype=token_dtype(vocab_size), mode="r")
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: cannot be read as an array of token ids ({exc})") from None
    if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
        raise UserError(f"{path}: expected a 1-D integer array of token ids, got {tokens.ndim}-D {tokens.dtype}")
    if len(tokens) == 0:
        raise UserError(f"{path}: the token array is empty")
    top = int(tokens.max())
    if top >= vocab_size or int(tokens.min()) < 0:
        raise UserError(f"{path}: holds token id {top} but the vocabulary has {vocab_size} ids (0..{vocab_size - 1})")
    return tokens


def _read_entry(data_path: Path, info_path: Path, dtype: np.dtype) -> np.ndarray | None:
    if not (data_path.is_file() and info_path.is_file()):
        return None
    try:
        info = json.loads(info_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    if info.get("format") != CACHE_FORMAT or info.get("dtype") != dtype.name:
        return None
    if data_path.stat().st_size != info["tokens"] * dtype.itemsize or info["tokens"] == 0:
        return None
    return np.memmap(data_path, dtype=dtype, mode="r")
