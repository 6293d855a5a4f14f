"""Norm kind none: the identity, with no weights; ``final_norm: none`` leaves the head to read the blocks' output."""

from __future__ import annotations

import torch

import specformer
from specformer_layers.norms.none import NoNorm

from fixtures.tiny import tiny_spec


def test_the_output_is_the_input() -> None:
    x = torch.randn(3, 5, 16)
    norm = NoNorm(dim=16)
    assert torch.equal(norm(x), x)
    assert list(norm.parameters()) == [] and list(norm.buffers()) == []


def test_a_model_without_a_final_norm_gives_the_head_of_the_last_block_output() -> None:
    spec = tiny_spec(final_norm="none", block={"layout": "postnorm", "norm": "layernorm"})
    model = specformer.build(spec, seed=0)
    ids = torch.arange(10).reshape(1, 10)
    seen = {}
    model.blocks[-1].register_forward_hook(lambda _m, _i, out: seen.setdefault("x", out))
    with torch.no_grad():
        logits = model(ids)
        # logits = h_L E^T: the tied head straight on the last block's (already normalised) output
        torch.testing.assert_close(logits, seen["x"] @ model.embedding.weight.T, rtol=0, atol=0)
    with_norm = specformer.build(tiny_spec(block={"layout": "postnorm", "norm": "layernorm"}), seed=0)
    assert model.num_parameters() == with_norm.num_parameters() - 2 * 32
    assert specformer.summarize(spec).total == model.num_parameters()
