"""Chat data streamed (``train.streaming`` with a chat jsonl): conversations read and tokenized as rows need them.

The train plugin's :class:`~specformer_train.stream.StreamRows` reads documents forward,
one after another, and records its place in checkpoints (epoch, file, document, tokens
already read), so a resumed run reads exactly the rows the uninterrupted one would have.
Here a document is one record of the jsonl (``messages`` or ``prompt``/``completion``),
encoded by the same function as the in-memory path (:func:`~specformer_finetune.chat_data.encode_record`)
and followed by the end-of-text token, so every token carries the same loss mask as there.
The mask travels as a second column beside the token ids and is cut into rows with them;
:meth:`ChatStreamRows.loss_mask` hands the trainer the mask of the rows it just read.

As with streamed text, rows are cut from the stream in reading order (no per-epoch offset
or row shuffle, which need the whole corpus), and the validation rows are the first
conversations, cut to exactly ``eval_steps x batch_size`` rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np

from specformer_text import Corpus
from specformer_train import StreamRows

from specformer_finetune.chat_data import encode_record, eot_counts, iter_records


class ChatStreamRows(StreamRows):
    """Streamed rows of a chat jsonl, with :meth:`loss_mask` giving the mask of the rows :meth:`rows` returned."""

    _columns = (2,)  # (token id, counted)

    def __init__(self, corpus: Corpus, tokenizer: Any, template: tuple[str, dict[str, str]] | None, *,
                 seq_len: int, seed: int, holdout_rows: int = 0) -> None:
        self.template = template  # read while the hold-out is encoded, inside StreamRows.__init__
        self._last: tuple[int, int, np.ndarray] | None = None
        super().__init__(corpus, tokenizer, seq_len=seq_len, seed=seed, holdout_rows=holdout_rows)
        held = self.val_tokens  # (n, 2) here
        self.val_mask = None if held is None else held[:, 1].astype(bool)
        self.val_tokens = None if held is None else np.ascontiguousarray(held[:, 0])

    def documents(self, path: Path, *, skip: int = 0) -> Iterator[dict[str, Any]]:
        return iter_records(path, skip=skip)

    def _encode(self, record: dict[str, Any]) -> np.ndarray:  # type: ignore[override]
        ids, counted = encode_record(record, self.tokenizer, self.template)
        ids.append(self.tokenizer.eot_id)
        counted.append(eot_counts(record, self.template))
        return np.stack([np.asarray(ids, dtype=np.int64), np.asarray(counted, dtype=np.int64)], axis=1)  # (n, 2)

    def rows(self, first: int, count: int) -> np.ndarray:
        both = super().rows(first, count)  # (count, seq_len + 1, 2)
        self._last = (first, count, both[..., 1].astype(bool))
        return np.ascontiguousarray(both[..., 0])  # (count, seq_len + 1)

    def loss_mask(self, first: int, count: int) -> np.ndarray:
        """``(count, seq_len + 1)`` bool for the rows just read by ``rows(first, count)`` (a stream reads forward)."""
        if self._last is None or self._last[:2] != (first, count):
            raise ValueError(f"a stream's loss mask is that of the rows just read: read rows({first}, {count}) first")
        return self._last[2]
