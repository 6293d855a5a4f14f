"""Packed documents run apart; leading padding counted."""

from __future__ import annotations

import torch

from specformer_layers.mixers.documents import by_document, leading_padding


def running_sum(x: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(x, dim=1)


def test_each_document_runs_on_its_own() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 7, 3)
    ids = torch.tensor([[0, 0, 1, 1, 1, 2, 2], [5, 5, 5, 5, 5, 5, 9]])
    got = by_document(x, ids, running_sum)
    want = torch.cat([
        torch.cat((running_sum(x[:1, 0:2]), running_sum(x[:1, 2:5]), running_sum(x[:1, 5:7])), 1),
        torch.cat((running_sum(x[1:, 0:6]), running_sum(x[1:, 6:7])), 1),
    ])
    torch.testing.assert_close(got, want)


def test_a_document_id_reused_later_in_the_row_is_a_new_document() -> None:
    x = torch.ones(1, 4, 1)
    got = by_document(x, torch.tensor([[3, 3, 4, 3]]), running_sum)
    assert got.flatten().tolist() == [1.0, 2.0, 1.0, 1.0]


def test_the_output_width_may_differ() -> None:
    got = by_document(torch.ones(1, 3, 2), torch.tensor([[0, 1, 1]]), lambda p: p.sum(-1, keepdim=True).cumsum(1))
    assert got.shape == (1, 3, 1) and got.flatten().tolist() == [2.0, 2.0, 4.0]


def test_leading_padding() -> None:
    assert leading_padding(torch.tensor([[-1, -1, 3], [0, 1, 2]])).tolist() == [2, 0]
