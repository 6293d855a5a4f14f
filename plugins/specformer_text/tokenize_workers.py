"""Tokenizing a corpus in worker processes, documents coming back in corpus order.

The main process reads the documents (so a bad file is still one clear error) and
sends them in chunks to ``workers`` processes, each holding its own copy of the
tokenizer (rebuilt from its JSON). At most two chunks per worker are in flight, so a
corpus larger than memory is never read ahead whole, and results are taken in the
order they were sent: the token array is the same, id for id, whatever the number of
workers. Processes are spawned (not forked): the parent has PyTorch's and the
tokenizers library's threads running, which a fork would copy in an unknown state.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from typing import Iterable, Iterator

import numpy as np

from specformer.tokenizers.tokenizer import Tokenizer, tokenizer_from_json

#: Below this many bytes of text, starting worker processes costs more than it saves.
PARALLEL_MIN_BYTES = 4_000_000
_CHUNK_BYTES = 1 << 20  # about this much text per task
_MAX_AUTO_WORKERS = 8

_worker_tokenizer: Tokenizer | None = None  # set in each worker by _start_worker


def choose_workers(requested: int | str, *, tokenizer: Tokenizer, total_bytes: int) -> int:
    """``train.tokenize_workers``: a count as given; auto is one per usable core (up to 8) for a corpus
    worth it, and 1 for the byte tokenizer (its ids are the bytes: nothing to share out)."""
    if isinstance(requested, int):
        return requested
    if getattr(tokenizer, "kind", None) == "byte" or total_bytes < PARALLEL_MIN_BYTES:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(_MAX_AUTO_WORKERS, cores))


def encode_document(tokenizer: Tokenizer, text: str, dtype: np.dtype) -> np.ndarray:
    """The ids of ``text`` (without the end-of-text token) as ``dtype``."""
    if getattr(tokenizer, "kind", None) == "byte":
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(dtype)  # ids are the bytes
    return np.asarray(tokenizer.encode(text), dtype=dtype)


def encoded_documents(documents: Iterable[str], tokenizer: Tokenizer, *, dtype: np.dtype,
                      workers: int) -> Iterator[tuple[np.ndarray, int]]:
    """``(ids, characters)`` of each document, in order, tokenized by ``workers`` processes (1: here)."""
    if workers <= 1:
        for text in documents:
            yield encode_document(tokenizer, text, dtype), len(text)
        return
    context = multiprocessing.get_context("spawn")
    with context.Pool(workers, initializer=_start_worker, initargs=(tokenizer.to_json(),)) as pool:
        pending: deque = deque()
        for chunk in _chunks(documents):
            pending.append(pool.apply_async(_encode_chunk, (chunk, np.dtype(dtype).str)))
            if len(pending) >= 2 * workers:
                yield from pending.popleft().get()
        while pending:
            yield from pending.popleft().get()


def _chunks(documents: Iterable[str]) -> Iterator[list[str]]:
    chunk: list[str] = []
    size = 0
    for text in documents:
        chunk.append(text)
        size += len(text)
        if size >= _CHUNK_BYTES:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _start_worker(tokenizer_json: str) -> None:
    global _worker_tokenizer
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the processes are the parallelism
    _worker_tokenizer = tokenizer_from_json(tokenizer_json)


def _encode_chunk(texts: list[str], dtype: str) -> list[tuple[np.ndarray, int]]:
    assert _worker_tokenizer is not None
    return [(encode_document(_worker_tokenizer, text, np.dtype(dtype)), len(text)) for text in texts]
