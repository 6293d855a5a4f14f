"""StopCondition on hand-written token tables: which rows finish, when, and on which token."""

from __future__ import annotations

import pytest
import torch

from specformer_generate.stopping import StopCondition

NEVER = torch.iinfo(torch.long).max


def table(*rows: list[int]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.long)


def test_eos_marks_the_rows_that_produced_it() -> None:
    stop = StopCondition(batch_size=3, eos=[7, 9])
    tokens = table([1, 7], [1, 9], [1, 8])
    assert stop.hits(tokens, 1).tolist() == [True, True, False]
    assert stop.hits(tokens, 0).tolist() == [False, False, False]


def test_a_stop_sequence_matches_only_when_it_ends_at_the_column() -> None:
    stop = StopCondition(batch_size=3, stop=[[4, 5, 6]])
    tokens = table([4, 5, 6, 0], [0, 4, 5, 6], [4, 5, 0, 6])
    assert stop.hits(tokens, 2).tolist() == [True, False, False]  # starts at column 0: column + 1 == len
    assert stop.hits(tokens, 3).tolist() == [False, True, False]
    # Too few columns yet for the whole sequence: no match, and no wrap-around slice.
    assert stop.hits(table([5, 6]), 1).tolist() == [False]
    assert stop.hits(table([6, 4, 5, 6]), 1).tolist() == [False]


def test_single_token_stop_sequence_and_eos_together() -> None:
    stop = StopCondition(batch_size=3, eos=[2], stop=[[3], [8, 9]])
    tokens = table([1, 2], [1, 3], [8, 9])
    assert stop.hits(tokens, 1).tolist() == [True, True, True]
    assert stop.hits(tokens, 0).tolist() == [False, False, False]


def test_update_records_the_first_finishing_step_only() -> None:
    stop = StopCondition(batch_size=2, eos=[7])
    assert stop.finished_at.tolist() == [NEVER, NEVER]
    assert stop.done.tolist() == [False, False]
    tokens = table([7, 0, 7], [0, 0, 7])
    stop.update(tokens, 0, step=0)
    assert stop.done.tolist() == [True, False]
    assert not stop.all_done()
    stop.update(tokens, 1, step=1)
    stop.update(tokens, 2, step=2)  # row 0 hits eos again: its end stays at step 0
    assert stop.finished_at.tolist() == [0, 2]
    assert stop.done.tolist() == [True, True]
    assert stop.all_done()


def test_without_eos_or_stop_nothing_ever_finishes() -> None:
    stop = StopCondition(batch_size=2)
    assert not stop.active
    stop.update(table([7], [7]), 0, step=0)
    assert stop.done.tolist() == [False, False]
    assert stop.finished_at.tolist() == [NEVER, NEVER]
    assert not stop.all_done()


def test_stop_alone_makes_it_active() -> None:
    stop = StopCondition(batch_size=1, stop=[[5]])
    assert stop.active
    stop.update(table([5]), 0, step=3)
    assert stop.finished_at.tolist() == [3]
    assert stop.all_done()


def test_an_empty_stop_sequence_is_refused_with_its_index() -> None:
    with pytest.raises(ValueError, match=r"stop\[1\] is an empty sequence; every stop sequence needs at least one token"):
        StopCondition(batch_size=1, stop=[[1], []])


def test_the_flags_live_on_the_requested_device() -> None:
    # "meta" stands in for an accelerator: the decode loop must not sync with the host per token.
    stop = StopCondition(batch_size=2, eos=[1], stop=[[2, 3]], device="meta")
    tensors = [stop.eos, *stop.stop, stop.done, stop.finished_at]
    assert {t.device.type for t in tensors} == {"meta"}
    assert [t.dtype for t in tensors] == [torch.long, torch.long, torch.bool, torch.long]
