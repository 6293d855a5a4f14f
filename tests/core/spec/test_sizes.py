"""Sizes without building: layer groups, the estimate, and validate/summary staying fast for huge specs."""

from __future__ import annotations

import copy
import itertools
import time

import pytest
import torch

import specformer
from specformer.model import wiring
from specformer.errors import SpecError
from specformer.spec.layer_groups import group_layers, overrides_of_layer
from specformer.spec.check import estimate, model_bytes
from specformer.spec import layer_selection
from specformer.model.summary import summarize

from conftest import TINY


def _brute_groups(n_layers, selections):
    found = {}
    for i in range(n_layers):
        sig = tuple(j for j, chosen in enumerate(selections) if i in list(chosen))
        first, count = found.get(sig, (i, 0))
        found[sig] = (first, count + 1)
    return sorted((first, count, sig) for sig, (first, count) in found.items())


SELECTS = ["0::2", "1::3", "-4:", "all", "2:9:4", "::-2", "5", [0, 7, 3], -1, "3:3000:7", ":5"]


@pytest.mark.parametrize("n_layers", [1, 2, 7, 12, 61])
def test_groups_match_a_layer_by_layer_count(n_layers):
    for chosen in itertools.combinations(SELECTS, 3):
        selections = []
        for select in chosen:
            try:
                selections.append(layer_selection(select, n_layers))
            except ValueError:
                continue
        got = sorted((g.first, g.count, g.overrides) for g in group_layers(n_layers, selections))
        assert got == _brute_groups(n_layers, selections), (n_layers, chosen)
        for first, _count, sig in got:
            assert overrides_of_layer(first, selections) == sig


def test_group_count_does_not_grow_with_layers():
    selections = [layer_selection("0::2", 10**12), layer_selection("-1", 10**12)]
    groups = group_layers(10**12, selections)  # a walk over the layers would never return
    assert sorted(g.count for g in groups) == [1, 5 * 10**11 - 1, 5 * 10**11]


def _spec(**model) -> dict:
    spec = copy.deepcopy(TINY)
    spec["model"].update(model)
    return spec


@pytest.mark.parametrize("model", [
    {},
    {"n_layers": 6, "layers": [{"select": "0::2", "mixer": {"window": 8}},
                               {"select": -1, "ffn": {"kind": "mlp", "hidden": 40}}]},
    {"tie_embeddings": False, "lm_head_bias": True, "pad_vocab_to_multiple": 64},
    {"tie_embeddings": True, "lm_head_bias": True, "pad_vocab_to_multiple": 64},
    {"n_layers": 3, "block": {"norm": "layernorm", "mixer": {"kind": "attention", "n_heads": 2},
                              "ffn": {"kind": "moe", "n_experts": 4, "top_k": 2, "hidden": 16}}},
])
def test_estimate_and_summary_equal_a_real_build(model):
    spec = _spec(**model)
    built = specformer.build(spec, seed=0)
    shape = estimate(spec)
    assert shape.parameters == sum(p.numel() for p in built.parameters())
    assert shape.parameter_bytes() == sum(p.numel() * p.element_size() for p in built.parameters())
    assert shape.buffer_bytes() == sum(b.numel() * b.element_size() for b in built.buffers())
    assert shape.total_bytes(torch.bfloat16) == sum(
        t.numel() * (2 if t.is_floating_point() else t.element_size())
        for t in itertools.chain(built.parameters(), built.buffers())
    )
    assert model_bytes(spec) == shape.total_bytes()
    assert summarize(spec).to_dict() == summarize(built).to_dict()


def test_a_million_layers_validate_and_summarise_from_one_block_per_distinct_layer(monkeypatch):
    spec = _spec(n_layers=1_000_000, layers=[{"select": "0::2", "mixer": {"window": 8}}])
    built = []
    real_make_block = wiring.make_block

    def counting_make_block(*args, **kwargs):
        built.append(args)
        return real_make_block(*args, **kwargs)

    monkeypatch.setattr(wiring, "make_block", counting_make_block)
    specformer.load_spec(spec)
    s = summarize(spec)
    # Two distinct layers (windowed, full), made by three passes of the size flow (load_spec's
    # check, summarize's check and its meta estimate): a layer-by-layer walk would make a million blocks.
    assert 0 < len(built) <= 3 * 2, len(built)
    per_block = summarize(_spec(n_layers=1))
    block = per_block.params["mixer"] + per_block.params["ffn"] + per_block.params.get("block norms", 0)
    assert s.total - s.params["embedding"] - s.params.get("final_norm", 0) == 1_000_000 * block


def test_a_bad_override_in_one_group_is_still_found_at_its_path():
    spec = _spec(n_layers=1_000_000, layers=[{"select": "999999", "mixer": {"n_heads": 5}}])
    with pytest.raises(SpecError, match=r"model.layers\[0\].mixer"):
        specformer.load_spec(spec)


def test_layers_may_differ_in_heads_each_positional_sized_by_its_own():
    """Each layer's positional scheme is built for its own heads (ALiBi slopes, RoPE width)."""
    spec = _spec(n_layers=4, layers=[{"select": 1, "mixer": {"n_heads": 2, "n_kv_heads": 2}}])
    spec["model"]["positional"] = {"kind": "alibi"}
    model = specformer.build(spec, seed=0)
    heads = [model.positional_of_layer(i).n_heads for i in range(4)]
    assert heads == [a.n_heads for a in model.attention_modules()] and heads[1] != heads[0]
    assert model(torch.zeros(1, 5, dtype=torch.long)).shape[:2] == (1, 5)


def test_a_long_explicit_layer_list_stays_fast():
    spec = _spec(n_layers=40_000, layers=[{"select": list(range(0, 40_000, 2)), "mixer": {"window": 8}}])
    start = time.monotonic()
    s = summarize(spec)
    assert time.monotonic() - start < 30  # a hang bound, not a speed target: list membership per layer took minutes
    assert s.n_layers == 40_000
