"""Streaming rows (``train.streaming``): the corpus read and tokenized lazily while training.

Without streaming, the whole corpus is tokenized into the cache before the first step
(:mod:`specformer_text.cache`). Streaming reads documents only as rows need them, so a
corpus larger than memory or than the disk cache trains at once:

- **Order.** Each epoch visits the corpus' files in an order drawn from
  ``(train.seed, epoch)``, and each file's documents in file order; every document is
  read exactly once per epoch. Documents are tokenized one by one, each followed by the
  end-of-text token, and the tokens of consecutive documents (and epochs) form one
  stream. Row ``n`` is tokens ``n * seq_len`` to ``n * seq_len + seq_len`` of it, as
  :class:`~specformer_train.data.PackedRows` cuts rows (without the per-epoch offset and
  shuffle, which need the whole corpus).
- **Validation.** The first documents in sorted file order, as many as make
  ``eval_steps * batch_size`` rows, are held out (kept in memory, cut to exactly those
  rows, so evaluation reads the same rows whatever the number of processes) and never
  trained on.
- **Position.** The stream's place is ``(epoch, file in the epoch's order, document in
  the file, tokens of that document already read)``: JSON in ``trainer.json`` (key
  ``extra.stream``). Resuming opens that file, skips to that document and that token,
  and reads exactly the rows the uninterrupted run would have read. Without a recorded
  position (a checkpoint of a run that did not stream) the stream is read from its start
  up to the run's row count: slower, still exact.

Every process of a distributed run reads the whole stream and keeps its own rows of
each global batch (as with packed rows), so tokenization is repeated per process.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from specformer.errors import UserError
from specformer.tokenizers.tokenizer import Tokenizer
from specformer_text import Corpus, encode_document, read_documents

STREAM_FORMAT = "specformer-stream/1"


@dataclass(frozen=True)
class StreamPosition:
    """Where the next token of the stream comes from."""

    epoch: int = 0
    shard: int = 0  # index into the epoch's file order
    document: int = 0  # index of the document in its file
    offset: int = 0  # tokens of that document (its end-of-text included) already read


class StreamRows:
    """Rows of ``seq_len + 1`` tokens read forward from the corpus, tokenized as they are needed."""

    rows_per_epoch = None  # unknown without reading the whole corpus

    def __init__(self, corpus: Corpus, tokenizer: Tokenizer, *, seq_len: int, seed: int,
                 holdout_rows: int = 0) -> None:
        if corpus.tokenized is not None:
            raise UserError("train.streaming reads documents, but --data is an already tokenized array; it is "
                            "memory-mapped anyway: train without streaming")
        self.files: list[Path] = list(corpus.files)
        self.text_field = corpus.text_field
        self.tokenizer = tokenizer
        self.seq_len = seq_len
        self.seed = seed
        self.corpus_key = corpus.fingerprint()[:24]
        self.val_tokens, self._holdout = self._hold_out(holdout_rows * seq_len + 1 if holdout_rows else 0)
        self._start(StreamPosition(), row=0)

    # -- the interface the trainer uses (as PackedRows) ---------------------------------

    def check_fits(self, global_batch: int) -> None:
        """Nothing to check before reading: an epoch without any document is reported when it happens."""

    def rows(self, first: int, count: int) -> np.ndarray:
        """Sequences ``first .. first + count - 1`` of the stream as ``(count, seq_len + 1)`` int64; forward only."""
        if first < self._row:
            raise ValueError(f"a stream is read forward only: asked for row {first}, already at row {self._row}")
        while self._row < first:  # rows of the other processes of this global batch
            self._advance()
        out = np.empty((count, self.seq_len + 1, *self._columns), dtype=np.int64)
        for i in range(count):
            self._fill(self.seq_len + 1)
            out[i] = self._peek(self.seq_len + 1)
            self._advance()
        return out

    def position(self, sequences: int) -> dict[str, Any]:
        """JSON for a checkpoint taken after ``sequences`` rows (this reader moves there first)."""
        if sequences < self._row:
            raise ValueError(f"the stream is at row {self._row}, past the checkpoint's {sequences}")
        while self._row < sequences:
            self._advance()
        self._fill(1)
        return {"format": STREAM_FORMAT, "sequences": sequences, "corpus": self.corpus_key,
                "files": len(self.files), **asdict(self._segments[0][0])}

    def restore(self, position: dict[str, Any] | None, *, sequences: int) -> None:
        """Continue after ``sequences`` rows, from the recorded ``position`` when it is this corpus'."""
        if isinstance(position, dict) and position.get("format") == STREAM_FORMAT \
                and position.get("sequences") == sequences:
            if position.get("corpus") == self.corpus_key and position.get("files") == len(self.files):
                fields = {name: int(position[name]) for name in ("epoch", "shard", "document", "offset")}
                self._start(StreamPosition(**fields), row=sequences)
                return
            if position.get("corpus") != self.corpus_key:  # --new-data: the new corpus from its start
                self._start(StreamPosition(), row=sequences)
                return
        self._start(StreamPosition(), row=0)  # no usable position: read up to the row count
        while self._row < sequences:
            self._advance()

    # -- the stream ----------------------------------------------------------------------

    def order(self, epoch: int) -> list[int]:
        """Indices of ``self.files`` in the order epoch ``epoch`` reads them."""
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.files)).tolist()

    def _start(self, position: StreamPosition, *, row: int) -> None:
        self._row = row
        self._segments: deque[tuple[StreamPosition, np.ndarray]] = deque()
        self._buffered = 0
        self._documents = self._read_from(position)

    def _read_from(self, start: StreamPosition) -> Iterator[tuple[StreamPosition, np.ndarray]]:
        """Every document from ``start`` on, epoch after epoch, as (its position, its tokens + end-of-text)."""
        epoch, first = start.epoch, True
        while True:
            order, found = self.order(epoch), False
            for shard in range(start.shard if first else 0, len(order)):
                index = order[shard]
                skip = self._held_out_in(index)
                if skip is None:
                    continue  # the whole file is validation
                if first and shard == start.shard:
                    skip = max(skip, start.document)
                for document, text in enumerate(self.documents(self.files[index], skip=skip), start=skip):
                    found = True
                    tokens = self._encode(text)
                    offset = start.offset if first and (shard, document) == (start.shard, start.document) else 0
                    yield StreamPosition(epoch, shard, document, offset), tokens[offset:]
            if not found and not first:
                raise UserError(f"train.streaming: the corpus has no document to train on after the "
                                f"{0 if self.val_tokens is None else len(self.val_tokens):,} tokens held out for validation; use more data or "
                                "train.val_fraction: 0")
            epoch, first = epoch + 1, False

    # A subclass streams other documents (the finetune plugin's chat records) by overriding these two and
    # ``_columns``: documents are whatever ``documents`` yields, and ``_encode`` turns one into its tokens,
    # ``(n,)`` or ``(n, *_columns)`` with the token id in column 0 (more columns travel beside it, cut alike).
    _columns: tuple[int, ...] = ()

    def documents(self, path: Path, *, skip: int = 0) -> Iterator[Any]:
        """The documents of ``path`` from document ``skip`` on (0-based), in file order."""
        return read_documents(path, text_field=self.text_field, skip=skip)

    def _encode(self, text: str) -> np.ndarray:
        ids = encode_document(self.tokenizer, text, np.dtype(np.int64))
        return np.append(ids, np.int64(self.tokenizer.eot_id))

    def _fill(self, count: int) -> None:
        while self._buffered < count:
            position, tokens = next(self._documents)
            if len(tokens):
                self._segments.append((position, tokens))
                self._buffered += len(tokens)

    def _peek(self, count: int) -> np.ndarray:
        parts, need = [], count
        for _, tokens in self._segments:
            parts.append(tokens[:need])
            need -= len(parts[-1])
            if need == 0:
                break
        return np.concatenate(parts)

    def _advance(self) -> None:
        """Move one row on: drop ``seq_len`` tokens (the row's last token starts the next row)."""
        self._fill(self.seq_len + 1)
        drop = self.seq_len
        while drop:
            position, tokens = self._segments[0]
            if len(tokens) <= drop:
                self._segments.popleft()
                drop -= len(tokens)
                self._buffered -= len(tokens)
            else:
                self._segments[0] = (replace(position, offset=position.offset + drop), tokens[drop:])
                self._buffered -= drop
                drop = 0
        self._row += 1

    # -- validation ---------------------------------------------------------------------

    def _hold_out(self, count: int) -> tuple[np.ndarray | None, tuple[int, int]]:
        """The first documents (sorted file order) making ``count`` tokens, and where training starts."""
        if count == 0:
            return None, (0, 0)
        parts, total = [], 0
        for index, path in enumerate(self.files):
            for document, text in enumerate(self.documents(path)):
                if total >= count:  # exactly the rows asked for; the rest of the last document is not trained on
                    return np.concatenate(parts)[:count], (index, document)
                parts.append(self._encode(text))
                total += len(parts[-1])
        raise UserError(f"train.streaming: the corpus ({total:,} tokens) is no longer than the {count:,} tokens "
                        "held out for validation (eval_steps x batch_size rows); use more data, fewer "
                        "train.eval_steps, or train.val_fraction: 0")

    def _held_out_in(self, index: int) -> int | None:
        """How many leading documents of file ``index`` are validation (None: all of them)."""
        file, document = self._holdout
        if index < file:
            return None
        return document if index == file else 0
