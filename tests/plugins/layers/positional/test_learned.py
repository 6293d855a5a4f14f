"""Learned absolute positions: a table lookup."""

from __future__ import annotations

import torch

from specformer_layers.positional.learned import LearnedPositions
from fixtures.tiny import tiny_spec


def test_lookup_and_padding() -> None:
    m = LearnedPositions(context_length=8, d_model=4)
    positions = torch.tensor([[0, 5, -1]])
    out = m.embed(positions)
    assert torch.equal(out[0, 1], m.table.weight[5])
    assert torch.equal(out[0, 2], m.table.weight[0])
    m.init_weights(std=0.5, residual_std=0.1)
    assert 0.2 < m.table.weight.std().item() < 0.8


def test_offset_rows_come_before_position_zero_and_are_counted() -> None:
    """OPT's table: two rows before position 0's, never read, counted in the parameters as transformers counts them."""
    import specformer
    from specformer_layers.positional.params import LearnedPositionsParams

    m = LearnedPositions(LearnedPositionsParams(offset=2), context_length=8, d_model=4)
    assert m.table.weight.shape == (10, 4)
    out = m.embed(torch.tensor([[0, 7, -1]]))
    assert torch.equal(out[0, 0], m.table.weight[2])
    assert torch.equal(out[0, 1], m.table.weight[9])
    assert torch.equal(out[0, 2], m.table.weight[2])  # padding reads position 0's row, as without an offset
    spec = tiny_spec(vocab_size=16, d_model=8, n_layers=1, context_length=8, positional={"kind": "learned", "offset": 2},
                     block={"layout": "prenorm", "norm": "layernorm", "mixer": {"kind": "attention", "n_heads": 2},
                            "ffn": {"kind": "mlp", "hidden": 16}})
    model = specformer.build(spec, seed=0)
    assert model.positional.table.weight.shape == (10, 8)
    assert specformer.summarize(spec).total == sum(p.numel() for p in model.parameters())
