"""Packed training rows and the order they are read in.

The tokenized corpus is one flat array in which documents follow each other,
separated by the end-of-text token. A row is ``seq_len + 1`` consecutive tokens (the
inputs and, shifted by one, the targets), so no position is padding. Each epoch cuts
the training split into rows starting at a random offset below ``seq_len`` (every
epoch sees different cuts) and reads them in a random order; both are drawn from a
generator seeded by ``(seed, epoch)``.

The number of rows per epoch is the same whatever the offset, so the rows of a run
are a pure function of how many sequences it has consumed: that count is the whole
"data position" a checkpoint stores, and resuming reads exactly the rows the
uninterrupted run would have read. Processes of a distributed run take disjoint
slices of each global batch, in an order that makes one process with the whole batch
see the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specformer.errors import UserError


@dataclass(frozen=True)
class Split:
    """The training and validation token arrays (views of the corpus)."""

    train: np.ndarray
    val: np.ndarray | None


def split_tokens(tokens: np.ndarray, *, val_fraction: float, seq_len: int) -> Split:
    """Hold out the last ``val_fraction`` of the tokens for validation (as nanoGPT's 90/10 split does)."""
    if val_fraction <= 0:
        return Split(train=tokens, val=None)
    n_val = int(round(len(tokens) * val_fraction))
    if n_val < seq_len + 1:
        raise UserError(
            f"the validation split ({val_fraction:g} of {len(tokens):,} tokens = {n_val:,}) is shorter than one row "
            f"of {seq_len + 1} tokens; use more data, a larger train.val_fraction, or train.val_fraction: 0"
        )
    return Split(train=tokens[: len(tokens) - n_val], val=tokens[len(tokens) - n_val :])


class PackedRows:
    """Rows of ``seq_len + 1`` tokens cut from ``tokens``, reshuffled every epoch."""

    def __init__(self, tokens: np.ndarray, *, seq_len: int, seed: int) -> None:
        self.tokens = tokens
        self.seq_len = seq_len
        self.seed = seed
        # An offset o < seq_len leaves (len - 1 - o) // seq_len full rows; the smallest
        # (o = seq_len - 1) is used for every epoch so the count never depends on o.
        self.rows_per_epoch = max(0, (len(tokens) - seq_len) // seq_len)
        self._epoch: int | None = None
        self._order = np.empty(0, dtype=np.int64)
        self._offset = 0

    def check_fits(self, global_batch: int) -> None:
        if self.rows_per_epoch < global_batch:
            raise UserError(
                f"the training split has {len(self.tokens):,} tokens: {self.rows_per_epoch} rows of {self.seq_len + 1}, "
                f"fewer than one global batch of {global_batch} sequences; use more data or a smaller "
                f"train.batch_size / train.seq_len"
            )

    def _prepare(self, epoch: int) -> None:
        if self._epoch != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._offset = int(rng.integers(self.seq_len))
            self._order = rng.permutation(self.rows_per_epoch)
            self._epoch = epoch

    def position(self, sequences: int) -> dict | None:
        """What a checkpoint must store beyond ``sequences`` to resume: nothing, rows are a function of it."""
        return None

    def restore(self, position: dict | None, *, sequences: int) -> None:
        """Continue after ``sequences`` rows (nothing to do: see :meth:`position`)."""

    def rows(self, first: int, count: int) -> np.ndarray:
        """Sequences ``first .. first + count - 1`` of the run's stream, as ``(count, seq_len + 1)`` int64."""
        out = np.empty((count, self.seq_len + 1), dtype=np.int64)
        for i in range(count):
            epoch, index = divmod(first + i, self.rows_per_epoch)
            self._prepare(epoch)
            start = self._offset + int(self._order[index]) * self.seq_len
            out[i] = self.tokens[start : start + self.seq_len + 1]
        return out


class EvalRows:
    """Fixed validation rows (no offset, no shuffle), spread evenly over the split."""

    def __init__(self, tokens: np.ndarray, *, seq_len: int) -> None:
        self.tokens = tokens
        self.seq_len = seq_len
        self.count = max(0, (len(tokens) - 1) // seq_len)

    def chosen(self, limit: int | None) -> np.ndarray:
        """Indices of ``limit`` rows spread over the split (every row when ``limit`` is None or larger)."""
        if limit is None or limit >= self.count:
            return np.arange(self.count)
        return np.linspace(0, self.count - 1, num=limit).round().astype(np.int64)

    def rows(self, indices: np.ndarray) -> np.ndarray:
        out = np.empty((len(indices), self.seq_len + 1), dtype=np.int64)
        for i, index in enumerate(indices):
            start = int(index) * self.seq_len
            out[i] = self.tokens[start : start + self.seq_len + 1]
        return out


def local_slice(global_batch: int, *, micro_batch: int, micro_step: int, rank: int, world_size: int) -> slice:
    """Which sequences of a global batch one process reads in one micro-step.

    The global batch is laid out as ``[micro_step][rank][micro_batch]``, so with one
    process and ``world_size`` times the micro-batch the same rows land in the same
    micro-step.
    """
    start = (micro_step * world_size + rank) * micro_batch
    if start + micro_batch > global_batch:
        raise ValueError(f"micro-step {micro_step} of rank {rank} reads past the global batch of {global_batch}")
    return slice(start, start + micro_batch)
