"""Rotary tables too large to compute are only sized on the meta device, and can never be materialised."""

from __future__ import annotations

import pytest
import torch

from specformer_layers.positional.fp32 import SIZED_ONLY_ELEMENTS, rope_exponents
from specformer_layers.positional.params import RotaryPositionsParams
from specformer_layers.positional.rope import RotaryPositions


def test_a_huge_rotary_table_is_only_sized_on_meta_and_refuses_to_materialise() -> None:
    head_dim = 4 * SIZED_ONLY_ELEMENTS
    with torch.device("meta"):
        rope = RotaryPositions(head_dim=head_dim, context_length=8)
    assert rope.inv_freq.is_meta and rope.inv_freq.shape == (head_dim // 2,)
    with pytest.raises(ValueError, match="only sized on the meta device"):
        rope.to_empty(device="cpu")


def test_ordinary_tables_are_computed_even_on_meta_and_restored_exactly() -> None:
    with torch.device("meta"):
        rope = RotaryPositions(RotaryPositionsParams(theta=500000.0), head_dim=64, context_length=8)
    rope.to_empty(device="cpu")
    expected = 1.0 / (500000.0 ** (torch.arange(0, 64, 2, dtype=torch.int64).float() / 64))  # Llama's formula
    torch.testing.assert_close(rope.inv_freq, expected, rtol=0, atol=0)
    assert rope_exponents(64).device.type == "cpu"
