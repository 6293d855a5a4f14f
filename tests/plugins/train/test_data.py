"""Packed rows, evaluation rows, the validation split and per-process slices, on arange corpora.

With ``tokens = arange(N)`` a row's values are its own positions, so every property is
checked by arithmetic written out here.
"""

from __future__ import annotations

import numpy as np
import pytest

from specformer.errors import UserError
from specformer_train.data import EvalRows, PackedRows, local_slice, split_tokens


def test_the_validation_split_is_the_last_fraction() -> None:
    tokens = np.arange(100)
    split = split_tokens(tokens, val_fraction=0.1, seq_len=9)  # 10 tokens: exactly one row of 10
    assert split.train.tolist() == list(range(90))
    assert split.val.tolist() == list(range(90, 100))
    whole = split_tokens(tokens, val_fraction=0.0, seq_len=9)
    assert whole.val is None and whole.train.tolist() == list(range(100))


def test_a_validation_split_shorter_than_a_row_is_refused() -> None:
    with pytest.raises(UserError) as caught:
        split_tokens(np.arange(100), val_fraction=0.1, seq_len=10)  # 10 tokens < a row of 11
    assert str(caught.value) == (
        "the validation split (0.1 of 100 tokens = 10) is shorter than one row of 11 tokens; use more data, "
        "a larger train.val_fraction, or train.val_fraction: 0")


@pytest.mark.parametrize("n, seq_len", [(101, 10), (100, 10), (110, 10), (111, 10), (9, 4), (5, 8)])
def test_rows_per_epoch_fit_at_every_offset(n: int, seq_len: int) -> None:
    packed = PackedRows(np.arange(n), seq_len=seq_len, seed=0)
    # The count at the largest offset (seq_len - 1) of full rows of seq_len + 1 tokens.
    expected = max(0, (n - 1 - (seq_len - 1)) // seq_len)
    assert packed.rows_per_epoch == expected


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_an_epoch_is_every_row_once_at_one_offset(seed: int) -> None:
    n, seq_len = 203, 10
    packed = PackedRows(np.arange(n), seq_len=seq_len, seed=seed)
    per_epoch = packed.rows_per_epoch
    for epoch in range(3):
        rows = packed.rows(epoch * per_epoch, per_epoch)
        assert rows.shape == (per_epoch, seq_len + 1) and rows.dtype == np.int64
        assert (np.diff(rows, axis=1) == 1).all()  # consecutive tokens: the targets are the inputs shifted
        starts = rows[:, 0]
        offset = int(starts.min())
        assert 0 <= offset < seq_len
        assert sorted(starts.tolist()) == [offset + k * seq_len for k in range(per_epoch)]
        assert rows.max() < n


def test_check_fits_needs_one_global_batch() -> None:
    packed = PackedRows(np.arange(41), seq_len=10, seed=0)  # 3 rows
    packed.check_fits(3)
    with pytest.raises(UserError) as caught:
        packed.check_fits(4)
    assert str(caught.value) == (
        "the training split has 41 tokens: 3 rows of 11, fewer than one global batch of 4 sequences; "
        "use more data or a smaller train.batch_size / train.seq_len")


def test_eval_rows_are_fixed_and_spread_over_the_split() -> None:
    rows = EvalRows(np.arange(101), seq_len=10)
    assert rows.count == 10
    assert rows.chosen(None).tolist() == list(range(10))
    assert rows.chosen(10).tolist() == list(range(10))
    assert rows.chosen(25).tolist() == list(range(10))
    assert rows.chosen(4).tolist() == [0, 3, 6, 9]
    assert np.arange(100, 110)[rows.chosen(4)].tolist() == [100, 103, 106, 109]  # integer indices
    assert rows.chosen(1).tolist() == [0]
    got = rows.rows(np.array([0, 9]))
    assert got.dtype == np.int64
    assert got.tolist() == [list(range(0, 11)), list(range(90, 101))]
    assert EvalRows(np.arange(10), seq_len=10).count == 0


@pytest.mark.parametrize("world_size, micro", [(1, 4), (2, 2), (4, 1)])
def test_local_slices_tile_the_global_batch_in_micro_step_order(world_size: int, micro: int) -> None:
    global_batch, steps = 8, 8 // (world_size * micro)
    seen = []
    for step in range(steps):
        for rank in range(world_size):
            s = local_slice(global_batch, micro_batch=micro, micro_step=step, rank=rank, world_size=world_size)
            assert s == slice((step * world_size + rank) * micro, (step * world_size + rank + 1) * micro)
            seen.extend(range(global_batch)[s])
    assert seen == list(range(global_batch))


def test_a_slice_past_the_global_batch_is_refused() -> None:
    assert local_slice(8, micro_batch=4, micro_step=1, rank=0, world_size=1) == slice(4, 8)
    with pytest.raises(ValueError, match=r"^micro-step 2 of rank 0 reads past the global batch of 8$"):
        local_slice(8, micro_batch=4, micro_step=2, rank=0, world_size=1)


def test_order_is_a_pure_function_of_the_position() -> None:
    tokens = np.arange(5000)
    a = PackedRows(tokens, seq_len=8, seed=3)
    b = PackedRows(tokens, seq_len=8, seed=3)
    whole = a.rows(0, 1500)  # crosses two epoch boundaries
    pieces = np.concatenate([b.rows(start, 100) for start in range(0, 1500, 100)])
    assert np.array_equal(whole, pieces)
    assert np.array_equal(PackedRows(tokens, seq_len=8, seed=3).rows(1060, 5), whole[1060:1065]), "read from the middle"
    epochs = [a.rows(e * a.rows_per_epoch, a.rows_per_epoch) for e in range(2)]
    assert not np.array_equal(epochs[0], epochs[1]), "each epoch reshuffles"
    assert not np.array_equal(PackedRows(tokens, seq_len=8, seed=4).rows(0, 50), whole[:50])


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
