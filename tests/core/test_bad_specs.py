"""Hypothesis: whatever a person writes, validation answers with SpecError, never a crash from deep inside."""

from __future__ import annotations

import copy

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specformer
from specformer.errors import SpecError

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
    ("model", "positional"), ("model", "block"), ("model", "block", "norm"), ("model", "block", "attention"),
    ("model", "block", "attention", "n_heads"), ("model", "block", "attention", "n_kv_heads"),
    ("model", "block", "attention", "head_dim"), ("model", "block", "attention", "window"),
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


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=st.lists(st.tuples(st.sampled_from(PATHS), values), min_size=1, max_size=3))
def test_any_spec_is_either_valid_and_runs_or_a_spec_error(changes):
    spec = TINY
    for path, value in changes:
        spec = mutate(spec, path, value)
    try:
        loaded = specformer.load_spec(spec)
    except SpecError as exc:
        assert exc.problems and all(str(p) for p in exc.problems)
        return
    m = loaded.model
    if m.d_model * m.n_layers > 4096 or m.vocab_size > 4096 or m.context_length > 4096:
        return  # valid but too large to run here; validation already built it on the meta device
    model = specformer.build(loaded)
    logits = model(torch.zeros(1, min(4, m.context_length), dtype=torch.long))
    assert logits.shape[-1] == m.vocab_size
