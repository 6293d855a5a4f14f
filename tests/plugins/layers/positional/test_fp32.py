"""Float32Tables: derived tables keep their float32 values through casts and device moves."""

from __future__ import annotations

import pytest
import torch

from specformer_layers.positional.fp32 import Float32Tables, rope_exponents


class Table(Float32Tables):
    def __init__(self) -> None:
        super().__init__()
        self.register_table("values", torch.tensor([1 / 3, 1e-7, 123456.789], device="cpu"))
        self.weight = torch.nn.Parameter(torch.ones(2))


def test_cast_keeps_tables_float32_and_exact() -> None:
    m = Table()
    exact = m.values.clone()
    m.to(torch.bfloat16)
    assert m.weight.dtype == torch.bfloat16
    assert m.values.dtype == torch.float32
    assert torch.equal(m.values, exact)
    m.double()
    assert m.values.dtype == torch.float32 and torch.equal(m.values, exact)


def test_tables_are_not_in_the_state_dict() -> None:
    assert list(Table().state_dict()) == ["weight"]


def test_built_on_meta_then_materialised() -> None:
    with torch.device("meta"):
        m = Table()
    assert m.values.is_meta
    m.to_empty(device="cpu")
    torch.testing.assert_close(m.values, torch.tensor([1 / 3, 1e-7, 123456.789]))


def test_meta_values_are_refused() -> None:
    m = Float32Tables()
    with pytest.raises(ValueError, match="real device"):
        m.register_table("x", torch.empty(3, device="meta"))


def test_rope_exponents() -> None:
    assert torch.equal(rope_exponents(8), torch.tensor([0.0, 0.25, 0.5, 0.75]))
    with torch.device("meta"):
        assert rope_exponents(4).device.type == "cpu"
