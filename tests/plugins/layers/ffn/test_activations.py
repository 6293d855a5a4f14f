"""Each named activation by its formula."""

from __future__ import annotations

import math

import pytest
import torch

from specformer_layers.ffn.activations import ACTIVATIONS


def _gelu(v: float) -> float:
    return 0.5 * v * (1 + math.erf(v / math.sqrt(2)))


def _gelu_tanh(v: float) -> float:
    return 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))


FORMULAS = {
    "gelu": _gelu,
    "gelu_tanh": _gelu_tanh,
    "relu": lambda v: max(v, 0.0),
    "relu2": lambda v: max(v, 0.0) ** 2,
    "silu": lambda v: v / (1 + math.exp(-v)),
}


def test_every_activation_has_a_formula() -> None:
    assert set(ACTIVATIONS) == set(FORMULAS)


@pytest.mark.parametrize("name", sorted(FORMULAS))
def test_formula(name: str) -> None:
    xs = [-3.0, -0.5, 0.0, 0.3, 2.0, 5.0]
    got = ACTIVATIONS[name](torch.tensor(xs, dtype=torch.float64)).tolist()
    assert got == pytest.approx([FORMULAS[name](v) for v in xs], rel=1e-9, abs=1e-12)
