"""Parallel wiring by its formula, with shared (GPT-J) and separate (GPT-NeoX) norms."""

from __future__ import annotations

import torch

from specformer_layers.layouts.parallel import ParallelBlock

from .stubs import D, StubAttention, StubFFN, norm_maker


def build(shared_norm: bool) -> ParallelBlock:
    return ParallelBlock(ParallelBlock.Params(shared_norm=shared_norm), mixer=StubAttention(D), ffn=StubFFN(D),
                         make_norm=norm_maker())


def test_separate_norms() -> None:
    block = build(shared_norm=False)
    x = torch.randn(2, 3, D, dtype=torch.float64)
    expected = x + block.mixer(block.attention_norm(x), None) + block.ffn(block.ffn_norm(x))
    torch.testing.assert_close(block(x, None), expected, rtol=0, atol=0)  # the same operations: bit for bit
    assert block.attention_norm is not block.ffn_norm


def test_shared_norm() -> None:
    block = build(shared_norm=True)
    assert block.ffn_norm is None
    x = torch.randn(2, 3, D, dtype=torch.float64)
    h = block.attention_norm(x)
    torch.testing.assert_close(block(x, None), x + block.mixer(h, None) + block.ffn(h), rtol=0, atol=0)  # the same operations: bit for bit


def test_default_is_two_norms() -> None:
    assert ParallelBlock.Params().shared_norm is False
