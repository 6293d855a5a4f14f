"""Learned absolute positions: a table lookup."""

from __future__ import annotations

import torch

from specformer_layers.positional.learned import LearnedPositions


def test_lookup_and_padding() -> None:
    m = LearnedPositions(context_length=8, d_model=4)
    positions = torch.tensor([[0, 5, -1]])
    out = m.embed(positions)
    assert torch.equal(out[0, 1], m.table.weight[5])
    assert torch.equal(out[0, 2], m.table.weight[0])
    m.init_weights(std=0.5, residual_std=0.1)
    assert 0.2 < m.table.weight.std().item() < 0.8
