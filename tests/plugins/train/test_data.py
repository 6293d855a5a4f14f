"""Packed rows, their order, the validation split and the slices processes read."""

from __future__ import annotations

import numpy as np
import pytest

from specformer.errors import UserError
from specformer_train.data import EvalRows, PackedRows, local_slice, split_tokens


def test_rows_are_consecutive_tokens_from_an_epoch_offset() -> None:
    tokens = np.arange(1000)
    rows = PackedRows(tokens, seq_len=16, seed=0)
    assert rows.rows_per_epoch == (1000 - 16) // 16
    batch = rows.rows(0, rows.rows_per_epoch)
    assert batch.shape == (rows.rows_per_epoch, 17)
    assert (np.diff(batch, axis=1) == 1).all(), "each row is a run of consecutive tokens"
    starts = np.sort(batch[:, 0])
    assert (np.diff(starts) == 16).all() and 0 <= starts[0] < 16, "one epoch covers disjoint rows from its offset"
    assert batch[:, -1].max() < 1000


def test_order_is_a_pure_function_of_the_position() -> None:
    tokens = np.arange(5000)
    a = PackedRows(tokens, seq_len=8, seed=3)
    b = PackedRows(tokens, seq_len=8, seed=3)
    whole = a.rows(0, 1500)  # crosses two epoch boundaries
    pieces = np.concatenate([b.rows(start, 100) for start in range(0, 1500, 100)])
    assert np.array_equal(whole, pieces)
    epochs = [a.rows(e * a.rows_per_epoch, a.rows_per_epoch) for e in range(2)]
    assert not np.array_equal(epochs[0], epochs[1]), "each epoch reshuffles"
    assert not np.array_equal(PackedRows(tokens, seq_len=8, seed=4).rows(0, 50), whole[:50])


def test_split_holds_out_the_end() -> None:
    tokens = np.arange(1000)
    split = split_tokens(tokens, val_fraction=0.1, seq_len=16)
    assert split.train.tolist() == list(range(900)) and split.val.tolist() == list(range(900, 1000))
    assert split_tokens(tokens, val_fraction=0.0, seq_len=16).val is None
    with pytest.raises(UserError, match=r"validation split .* is shorter than one row of 65 tokens"):
        split_tokens(np.arange(500), val_fraction=0.1, seq_len=64)


def test_too_small_a_corpus_for_one_batch_is_a_user_error() -> None:
    rows = PackedRows(np.arange(100), seq_len=16, seed=0)
    rows.check_fits(5)
    with pytest.raises(UserError, match=r"5 rows of 17, fewer than one global batch of 6 sequences"):
        rows.check_fits(6)


def test_eval_rows_are_fixed_and_spread() -> None:
    val = EvalRows(np.arange(161), seq_len=16)
    assert val.count == 10
    assert val.chosen(None).tolist() == list(range(10))
    assert val.chosen(3).tolist() == [0, 4, 9] or val.chosen(3).tolist() == [0, 5, 9]
    assert val.rows(np.array([9]))[0].tolist() == list(range(144, 161))


def test_processes_split_each_global_batch_like_one_process() -> None:
    # 2 processes x 2 micro-steps x 3 rows: micro-step 0 is rows 0-5 (rank 0: 0-2, rank 1: 3-5).
    world, accum, micro = 2, 2, 3
    seen = []
    for step in range(accum):
        for rank in range(world):
            seen.append((step, rank, local_slice(12, micro_batch=micro, micro_step=step, rank=rank, world_size=world)))
    assert [(s.start, s.stop) for _, _, s in seen] == [(0, 3), (3, 6), (6, 9), (9, 12)]
    one = [local_slice(12, micro_batch=6, micro_step=m, rank=0, world_size=1) for m in range(2)]
    assert [(s.start, s.stop) for s in one] == [(0, 6), (6, 12)]
    with pytest.raises(ValueError, match="reads past the global batch of 12"):
        local_slice(12, micro_batch=3, micro_step=2, rank=0, world_size=2)


def test_each_epoch_starts_its_rows_at_its_own_random_offset() -> None:
    seq_len, seed = 16, 5
    tokens = np.arange(2000)  # each token is its own position: a row's first value is where it starts
    rows = PackedRows(tokens, seq_len=seq_len, seed=seed)
    offsets = []
    for epoch in range(12):
        starts = rows.rows(epoch * rows.rows_per_epoch, rows.rows_per_epoch)[:, 0]
        assert len(set(starts % seq_len)) == 1, "one offset per epoch"
        offsets.append(int(starts[0] % seq_len))
    # The documented draw: the first number of a generator seeded with (seed, epoch), below seq_len.
    assert offsets == [int(np.random.default_rng([seed, e]).integers(seq_len)) for e in range(12)]
    assert len(set(offsets)) > 3 and any(offsets), "offsets vary from epoch to epoch"
