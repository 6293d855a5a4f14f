"""NoPE: nothing added, nothing rotated, no bias."""

from __future__ import annotations

import torch

from specformer_layers.positional.nope import NoPositions


def test_changes_nothing() -> None:
    m = NoPositions()
    positions = torch.tensor([[0, 1, 2]])
    x = torch.randn(1, 2, 3, 4)
    assert m.embed(positions) is None
    assert m.rotate(x, m.prepare(positions)) is x
    assert m.attention_bias(positions, positions, None) is None
