"""Hypothesis: whatever a person writes, validation answers with SpecError, never a crash from deep inside.

Deterministic (``derandomize``: the same examples every run, no example database) and
bounded: a drawn spec that validates but is too large to build here (``ffn.hidden`` drawn
as 1.2e8 once tried to allocate tens of GB) must be refused by the memory guard under
the small limit the test sets, so the test can only fail on a real defect.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import specformer
from specformer.errors import MemoryLimitError, SpecError
from specformer.machine.memory import ENV_VAR
from specformer.spec.check import estimate

from conftest import TINY

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 300), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8), st.sampled_from(["rope", "rmsnorm", "attention", "mlp", "swiglu", "prenorm", "0::2", "all"]),
)
values = st.recursive(
    scalars,
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(st.text(max_size=10), children, max_size=3)),
    max_leaves=6,
)
PATHS = [
    ("model",), ("model", "vocab_size"), ("model", "d_model"), ("model", "n_layers"), ("model", "context_length"),
    ("model", "positional"), ("model", "block"), ("model", "block", "norm"), ("model", "block", "mixer"),
    ("model", "block", "mixer", "n_heads"), ("model", "block", "mixer", "n_kv_heads"),
    ("model", "block", "mixer", "head_dim"), ("model", "block", "mixer", "window"),
    ("model", "block", "ffn"), ("model", "block", "ffn", "hidden"), ("model", "block", "layout"),
    ("model", "layers"), ("model", "final_norm"), ("model", "tie_embeddings"), ("model", "logit_softcap"),
    ("model", "embedding_multiplier"), ("model", "pad_vocab_to_multiple"),
]


def mutate(spec: dict, path: tuple[str, ...], value) -> dict:
    spec = copy.deepcopy(spec)
    node = spec
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[path[-1]] = value
    return spec


LIMIT = 64 * 1024**2  # bytes a drawn model may take here; larger ones must be refused by the guard


@pytest.fixture(autouse=True)
def _small_memory_limit(monkeypatch):
    monkeypatch.setenv(ENV_VAR, str(LIMIT))


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(changes=st.lists(st.tuples(st.sampled_from(PATHS), values), min_size=1, max_size=3))
@example(changes=[(("model", "block", "ffn", "hidden"), 1.2e8)])  # the draw that allocated tens of GB
@example(changes=[(("model", "n_layers"), True)])  # a boolean read as 1
@example(changes=[(("model", "embedding_multiplier"), float("inf"))])
@example(changes=[(("model", "n_layers"), 3)])  # valid: builds and runs
def test_any_spec_is_either_valid_and_runs_or_a_spec_error(changes):
    assert os.environ[ENV_VAR] == str(LIMIT)
    spec = TINY
    for path, value in changes:
        spec = mutate(spec, path, value)
    try:
        loaded = specformer.load_spec(spec)
    except SpecError as exc:
        assert exc.problems and all(str(p) for p in exc.problems)
        assert len(str(exc)) < 20_000  # values are quoted as short excerpts
        return
    needed = estimate(loaded).total_bytes()
    if needed > LIMIT:
        try:
            specformer.build(loaded)
        except MemoryLimitError as exc:
            assert f"{needed:,} bytes" in str(exc)
            return
        raise AssertionError(f"a model of {needed:,} bytes was built under a limit of {LIMIT:,}")
    m = loaded.model
    model = specformer.build(loaded)
    logits = model(torch.zeros(1, min(4, m.context_length), dtype=torch.long))
    assert logits.shape[-1] == m.vocab_size
    assert sum(p.numel() * p.element_size() for p in model.parameters()) <= needed
