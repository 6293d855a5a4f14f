"""Each param declared once: the default factory, the one function for derived head sizes, the attention facts."""

from __future__ import annotations

import pytest
import torch
from pydantic import Field
from torch import nn

import specformer
from specformer.model.attention import AttentionLayer, HeadSizes, cache_slots_of, head_sizes, heads_of
from specformer.model.state import state_slots_of, uses_positions
from specformer.registry.components import Registry, construct
from specformer.registry.params import Params
from specformer.registry.discovery import get_registry


class Scaled(nn.Module):
    class Params(Params):
        factor: float = Field(default=2.0, gt=0, description="Multiplier.")
        shift: float = Field(default=0.0, description="Added after.")

    def __init__(self, params: "Scaled.Params | None" = None, *, dim: int) -> None:
        super().__init__()
        params = params if params is not None else Scaled.Params()
        self.dim, self.factor, self.shift = dim, params.factor, params.shift


def test_the_registry_passes_the_params_and_only_the_sizes_the_constructor_names():
    component = Registry().for_plugin("acme").register("norm", "scaled", factory=Scaled, params=Scaled.Params)
    made = component.make(Scaled.Params(factor=3.0, shift=-1.0), dim=8, layer_index=4, n_layers=9)
    assert (made.dim, made.factor, made.shift) == (8, 3.0, -1.0)


def test_a_factory_taking_any_keyword_gets_every_size():
    def anything(params, **sizes):
        return sizes

    assert construct(anything, Scaled.Params(), dim=8, n_layers=2) == {"dim": 8, "n_layers": 2}


def test_python_and_the_registry_get_the_same_defaults():
    registry = Registry()
    registry.for_plugin("acme").register("norm", "scaled", factory=Scaled, params=Scaled.Params)
    from_spec = registry.resolve("norm", {"kind": "scaled"}).make(dim=3)
    from_python = Scaled(dim=3)
    assert (from_spec.factor, from_spec.shift) == (from_python.factor, from_python.shift) == (2.0, 0.0)


def test_a_class_registered_as_its_own_factory_is_recorded_at_the_class():
    registry = Registry()
    component = registry.for_plugin("acme").register("norm", "scaled", factory=Scaled, params=Scaled.Params)
    assert "test_params_once.py" in component.source and __name__ in component.source
    assert registry.resolve("norm", {"kind": "scaled", "factor": 5}).make(dim=3).factor == 5.0


@pytest.mark.parametrize("given, expected", [
    (dict(d_model=64, n_heads=8), HeadSizes(8, 8, 8)),  # MHA: kv heads = heads, head_dim = d_model / heads
    (dict(d_model=64, n_heads=8, n_kv_heads=2), HeadSizes(8, 2, 8)),
    (dict(d_model=64, n_heads=8, n_kv_heads=1, head_dim=32), HeadSizes(8, 1, 32)),
    (dict(d_model=60, n_heads=8, head_dim=16), HeadSizes(8, 8, 16)),  # head_dim given: no need to divide
])
def test_head_sizes_resolves_the_derived_defaults(given, expected):
    assert head_sizes(**given) == expected


@pytest.mark.parametrize("given, message", [
    (dict(d_model=64, n_heads=8, n_kv_heads=3), r"n_kv_heads \(3\) must divide n_heads \(8\)"),
    (dict(d_model=60, n_heads=8), r"n_heads \(8\) must divide d_model \(60\) unless head_dim is given"),
])
def test_head_sizes_names_sizes_that_do_not_fit(given, message):
    with pytest.raises(ValueError, match=message):
        head_sizes(**given)


#: Required params of attentions beyond the heads (sized so that the head is 8 channels wide).
REQUIRED_EXTRA = {"mla": {"kv_lora_rank": 8, "qk_rope_head_dim": 4, "qk_nope_head_dim": 4, "v_head_dim": 8},
                  "mamba2": {"head_dim": 8, "state_size": 4},
                  "mamba": {"d_inner": 16, "state_size": 4},
                  "rglru": {"width": 16},
                  "mlstm": {"qk_dim": 32},  # default d_model / 2: heads of 8 as the others
                  "moa": {"n_experts": 3, "top_k": 2, "head_dim": 8},  # top_k x n_kv_heads query heads
                  "compressed": {"head_dim": 8, "q_lora_rank": 8, "rope_dim": 4, "compress_rate": 4},
                  "parallel": {"mixers": [{"kind": "attention", "n_heads": 4},
                                          {"kind": "mamba2", "n_heads": 4, "head_dim": 8, "state_size": 4}]}}


def test_every_registered_mixer_declares_the_facts_it_has(fresh_tiny_spec):
    """An attention declares every fact of one; a recurrence its state and its heads where it has heads, nothing
    it does not have (no window, no positions, nothing per token); no mixer (``none``) declares nothing."""
    registry = get_registry()
    for name in registry.names("mixer"):
        component = registry.get("mixer", name)
        params = {k: v for k, v in {"n_heads": 4, "n_kv_heads": 2, "window": 8}.items() if k in component.params.model_fields}
        params.update(REQUIRED_EXTRA.get(name, {}))
        with torch.device("meta"):
            layer = registry.resolve("mixer", {"kind": name, **params}).make(d_model=32, layer_index=1, n_layers=2,
                                                                                            context_length=32)
        assert layer.layer_index == 1, name
        heads, kept, state = heads_of(layer), cache_slots_of(layer), state_slots_of(layer)
        if kept is None and state is None:  # no mixer (mixer: none)
            assert (heads, uses_positions(layer)) == (None, False), name
            continue
        if kept is None:  # a recurrence: a state and nothing else it does not have
            assert getattr(layer, "window", None) is None and not uses_positions(layer), name
            assert "window" not in vars(type(layer)) and "window" not in vars(layer), name
            if "n_heads" in params:
                assert (heads.n_heads, heads.head_dim) == (4, 8), name
            else:  # one width-wide operation, no heads (short_conv)
                assert heads is None, name
            continue
        assert isinstance(layer, AttentionLayer), name
        # Without n_kv_heads, every head has its own key and value; compressed attention shares one by design.
        kv = 1 if name == "compressed" else params.get("n_kv_heads", 4)
        window = params.get("window")
        assert (heads.n_heads, heads.n_kv_heads, heads.head_dim, layer.window) == (4, kv, 8, window), name
        assert uses_positions(layer), name