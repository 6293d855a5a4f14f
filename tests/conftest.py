"""Shared fixtures: paths, small specs, and the hand-written reference models."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SPECS = REPO / "specs"
SHARED_DATA = REPO.parent / "shared" / "data"
sys.path.insert(0, str(REPO / "benchmarks"))  # the hand-written reference models live there
sys.path.insert(0, str(REPO / "tests"))  # `from conftest import ...` under --import-mode=importlib

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture
def tiny_spec() -> dict:
    """A small Llama-style spec as a dict; tests change copies of it."""
    return copy.deepcopy(TINY)


TINY = {
    "model": {
        "vocab_size": 97,
        "d_model": 32,
        "n_layers": 2,
        "context_length": 32,
        "positional": {"kind": "rope"},
        "block": {
            "norm": "rmsnorm",
            "attention": {"kind": "attention", "n_heads": 4, "n_kv_heads": 2},
            "ffn": {"kind": "swiglu", "hidden": 48},
        },
    }
}
