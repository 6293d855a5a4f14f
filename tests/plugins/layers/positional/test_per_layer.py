"""Positional schemes per layer (``model.block.positional``, ``model.layers[].positional``).

Gemma 3 (local layers RoPE 10k, every sixth RoPE 1M with linear scaling 8), SmolLM3 / Llama 4
(no positions on every fourth layer) and Cohere2 (position-free global layers) are written
this way. ``model.positional`` stays the default of every layer and the only place for
schemes that add to the embeddings.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

import specformer
from fixtures.caching import cached_logits
from specformer.errors import SpecError
from specformer_layers.positional.alibi import ALiBi
from specformer_layers.positional.nope import NoPositions
from specformer_layers.positional.rope import RotaryPositions

from ..support import VOCAB, tiny_spec_over_vocab

GEMMA3_LIKE: list[dict[str, Any]] = [
    {"select": "all", "positional": {"theta": 10000.0, "scaling": None}},
    {"select": "5::6", "positional": {"theta": 1_000_000.0, "scaling": {"kind": "linear", "factor": 8.0}}},
]


def mixed_spec(n_layers: int = 12, layers: list[dict[str, Any]] | None = None, **changes: Any) -> dict[str, Any]:
    spec = tiny_spec_over_vocab(n_layers=n_layers, **changes)
    spec["model"]["positional"] = {"kind": "rope", "theta": 1_000_000.0}
    spec["model"]["layers"] = copy.deepcopy(GEMMA3_LIKE if layers is None else layers)
    return spec


def test_without_overrides_every_layer_uses_model_positional() -> None:
    model = specformer.build(tiny_spec_over_vocab(), seed=0)
    assert model.layer_scheme is None and len(model.layer_positionals) == 0
    assert all(model.positional_of_layer(i) is model.positional for i in range(2))


def test_each_layer_gets_its_scheme_and_equal_schemes_are_one_module() -> None:
    layers = [*GEMMA3_LIKE, {"select": "3::4", "positional": "none"}]
    model = specformer.build(mixed_spec(layers=layers), seed=0)
    schemes = [model.positional_of_layer(i) for i in range(12)]
    for i, scheme in enumerate(schemes):
        if i % 4 == 3:
            assert isinstance(scheme, NoPositions), i
        elif i % 6 == 5:
            assert scheme.theta == 1e6 and scheme.scaling.factor == 8.0, i
        else:
            assert scheme.theta == 1e4 and scheme.scaling is None, i
    assert len({id(s) for s in schemes}) == 3  # local rope, global rope, none: one module each


def test_tables_are_prepared_once_per_forward_per_distinct_scheme(monkeypatch: pytest.MonkeyPatch) -> None:
    layers = [*GEMMA3_LIKE, {"select": "3::4", "positional": "none"},
              {"select": [0, 2], "positional": {"theta": 10000.0}}]  # the same as 'all' wrote: no new scheme
    model = specformer.build(mixed_spec(layers=layers), seed=0).eval()
    calls: list[int] = []
    for cls in (RotaryPositions, NoPositions):
        original = cls.prepare

        def counted(self: Any, positions: torch.Tensor, original: Any = original) -> Any:
            calls.append(id(self))
            return original(self, positions)

        monkeypatch.setattr(cls, "prepare", counted)
    model(torch.zeros(1, 7, dtype=torch.long))
    # The model-level rope (theta 1M, unscaled) is used by no layer, so it is not prepared at all.
    assert len(calls) == 3 and len(set(calls)) == 3


def test_each_layer_computes_what_a_model_with_its_scheme_everywhere_computes() -> None:
    """Layer 1 of a mix behaves as layer 1 of a model whose every layer has that layer's scheme."""
    layers = [{"select": 1, "positional": {"kind": "alibi"}}]
    mixed = specformer.build(mixed_spec(n_layers=2, layers=layers), seed=0, dtype=torch.float64).eval()
    uniform = specformer.build(tiny_spec_over_vocab(positional={"kind": "alibi"}), seed=0, dtype=torch.float64).eval()
    uniform.load_state_dict(mixed.state_dict())
    assert isinstance(mixed.positional_of_layer(1), ALiBi) and isinstance(mixed.positional_of_layer(0), RotaryPositions)
    seen: dict[str, torch.Tensor] = {}
    mixed.blocks[1].register_forward_hook(lambda m, args, out: seen.update(x=args[0], y=out))
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    mixed(ids)
    ctx = uniform._context(torch.arange(9).expand(2, 9), cache=None, plain_causal=True)
    torch.testing.assert_close(uniform.blocks[1](seen["x"], ctx), seen["y"], rtol=0, atol=0)


@pytest.mark.parametrize("layers", [
    GEMMA3_LIKE,
    [{"select": "1::2", "positional": "none"}],
    [{"select": "0::3", "positional": "alibi"}, {"select": 4, "positional": {"theta": 50.0, "fraction": 0.5}}],
    [{"select": "all", "positional": {"scaling": {"kind": "yarn", "factor": 2.0, "original_context_length": 8}}},
     {"select": 2, "positional": "none"}],
], ids=["gemma3", "nope-every-other", "alibi-and-partial-rope", "yarn-and-none"])
def test_mixes_are_causal_and_the_cache_equals_recompute(layers: list[dict[str, Any]]) -> None:
    """(Dynamic scaling is left out on purpose: its frequencies follow the longest position seen,
    so keys cached early differ from a recompute, as in transformers; test_past_context checks it.)"""
    model = specformer.build(mixed_spec(n_layers=6, layers=layers), seed=0, dtype=torch.float64).eval()
    ids = torch.randint(0, VOCAB, (2, 14), generator=torch.Generator().manual_seed(1))
    full = model(ids)
    changed = ids.clone()
    changed[:, 8:] = (changed[:, 8:] + 1) % VOCAB
    torch.testing.assert_close(model(changed)[:, :8], full[:, :8], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(cached_logits(model, ids, prompt=5)[0], full, rtol=1e-9, atol=1e-9)


def test_a_block_level_scheme_is_every_layers_default() -> None:
    spec = mixed_spec(n_layers=3, layers=[{"select": 2, "positional": {"theta": 77.0}}])
    spec["model"]["block"]["positional"] = {"kind": "rope", "theta": 500.0}
    model = specformer.build(spec, seed=0)
    assert [model.positional_of_layer(i).theta for i in range(3)] == [500.0, 500.0, 77.0]


@pytest.mark.parametrize(("where", "scheme"), [("layers", "learned"), ("layers", "sinusoidal"), ("block", "learned")])
def test_an_embedding_scheme_on_a_layer_is_one_clear_line(where: str, scheme: str) -> None:
    spec = mixed_spec(n_layers=4, layers=[])
    if where == "layers":
        spec["model"]["layers"] = [{"select": 1, "positional": scheme}]
        path = "model.layers[0].positional"
    else:
        spec["model"]["block"]["positional"] = scheme
        path = "model.block.positional"
    with pytest.raises(SpecError) as info:
        specformer.load_spec(spec)
    assert [(p.path, p.message.split(",")[0]) for p in info.value.problems] == [
        (path, f"{scheme!r} adds to the token embeddings")]
    assert "model.positional" in info.value.problems[0].message


def test_an_embedding_scheme_stays_model_level_beside_per_layer_rope() -> None:
    """Learned positions on the embeddings and RoPE inside some layers: both act."""
    spec = mixed_spec(n_layers=2, layers=[{"select": 1, "positional": "rope"}])
    spec["model"]["positional"] = "learned"
    model = specformer.build(spec, seed=0)
    assert isinstance(model.positional_of_layer(1), RotaryPositions)
    assert model.positional_of_layer(0) is model.positional
    assert model(torch.zeros(1, 5, dtype=torch.long)).shape == (1, 5, VOCAB)


def test_unknown_scheme_on_a_layer_names_its_path() -> None:
    spec = mixed_spec(n_layers=2, layers=[{"select": 0, "positional": "nope"}])
    with pytest.raises(SpecError, match=r"model.layers\[0\].positional.kind: unknown positional 'nope'"):
        specformer.load_spec(spec)


@pytest.mark.slow
def test_a_mix_compiles_with_fullgraph() -> None:
    torch._dynamo.reset()
    layers = [*GEMMA3_LIKE, {"select": "3::4", "positional": "none"}, {"select": 1, "positional": "alibi"}]
    model = specformer.build(mixed_spec(n_layers=6, layers=layers), seed=0).eval()
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(2))
    expected = model(ids)
    with torch.no_grad():
        got = torch.compile(model, fullgraph=True)(ids)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
