"""Every component's declared size check agrees with building it (docs/writing-a-plugin.md, "Size checks").

``specformer validate`` and :func:`specformer.load_spec` never build a module: each
component's ``Params.sized`` answers for its constructor (:mod:`specformer.model.sized`).
Here, over the registry and a grid of sizes around the edges (heads that do not divide,
odd rotary widths, top-k above the experts, absent sublayers), a check accepts exactly
when the constructor does, refuses with the constructor's own message, and, when it
accepts, gives the facts the builder reads from the module (heads, widths, whether it
reads positions, what it caches, its parameter count).

A component that declares no check still validates, by being built on the meta device.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from torch import nn

from specformer.errors import SpecError
from specformer.model.attention import cache_slots_of, heads_of, positional_dim_of
from specformer.model.residual import ResidualConnection, ResidualStream
from specformer.model.sized_by_building import facts_of
from specformer.registry.components import Component
from specformer.registry.discovery import build_registry, get_plugin_manager, get_registry
from specformer.registry.params import Params
from specformer.model.sized import Sized
from specformer.spec.check import check_spec, estimate
from specformer.spec.size_check import SIZED
from specformer.model.wiring import first_line

from conftest import SPECS, TINY


def _contract_cases() -> Any:
    """The component contract test's example params and changes (new components add theirs there, once)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "test_component_contract.py"
    spec = importlib.util.spec_from_file_location("_component_contract_cases", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_CONTRACT = _contract_cases()
EXAMPLES, CHANGES = _CONTRACT.EXAMPLES, _CONTRACT.CHANGES

#: The kinds a model is built from: every component of these declares its size check.
MODEL_KINDS = ("positional", "rope_scaling", "norm", "ffn", "router", "mixer", "layout", "residual", "indexer",
               "per_layer_input", "activation")

#: Sizes around the edges each kind's components meet: divisible and not, even and odd, zero heads.
GRID: dict[str, list[dict[str, Any]]] = {
    "norm": [{"dim": d} for d in (1, 3, 8)],
    "positional": [{"d_model": d, "n_heads": h, "head_dim": hd, "context_length": c}
                   for d, h, hd, c in ((32, 4, 8, 32), (33, 3, 11, 16), (32, 0, 32, 8), (6, 2, 3, 8), (32, 4, 2, 8),
                                       (32, 4, 1, 8), (30, 5, 6, 4))],
    "rope_scaling": [{"rotary_dim": r, "theta": 10000.0, "context_length": 16384} for r in (2, 3, 4, 8, 64)],
    "ffn": [{"d_model": d, "layer_index": 1, "n_layers": 2, "vocab_size": 50} for d in (8, 30, 32)],
    "mixer": [{"d_model": d, "layer_index": 1, "n_layers": 2, "context_length": 16} for d in (7, 24, 30, 32)],
    "router": [*({"d_model": 16, "n_experts": e, "top_k": k, "vocab_size": 50}
                 for e, k in ((4, 2), (4, 5), (6, 4), (3, 1), (8, 8))),
               {"d_model": 16, "n_experts": 4, "top_k": 2}],  # no vocabulary size: hash routing cannot be built
    "residual": [{"d_model": d} for d in (1, 8, 30)],
    "indexer": [{"d_model": d, "query_dim": q, "positional_dim": p} for d, q, p in ((16, 8, 4), (8, 16, 12), (12, 12, 16))],
    "per_layer_input": [{"vocab_size": v, "d_model": d, "n_layers": n} for v, d, n in ((50, 8, 2), (7, 30, 3))],
    "activation": [{}],  # elementwise: no sizes
}

#: A layout receives its sublayers: here each of a present and an absent mixer and ffn; its
#: connections to a residual stream of one stream or of several (which ``postnorm`` refuses); and a
#: per-layer input of 0 or 4 channels (``sandwich`` gates it in, on one stream only).
SUBLAYERS = {
    "mixer": [{"kind": "attention", "n_heads": 2}, {"kind": "none"}],
    "ffn": [{"kind": "mlp", "hidden": 8}, {"kind": "none"}],
    "residual": [{"kind": "single"}, {"kind": "mhc", "n_streams": 2}],
}


#: Params beyond the contract test's whose checks the grid would not reach otherwise.
MORE: dict[tuple[str, str], list[dict[str, Any]]] = {
    ("mixer", "attention"): [{"n_heads": 4, "n_kv_heads": 2, "qk_norm": "layernorm", "sinks": True,
                                  "qk_norm_scope": "per_head_weights", "output_gate": True, "qkv_bias": True},
                                 *({"n_heads": 4, "n_kv_heads": 2, "kv_from": k, "qk_norm": "rmsnorm", "qk_norm_scope": scope,
                                    "window": 4} for k, scope in ((0, "head"), (0, "per_head_weights"), (0, "all"), (1, "all"))),
                                 {"n_heads": 4, "k_eq_v": True, "v_norm": {"kind": "rmsnorm", "weight": False}}],
    ("mixer", "mla"): [{**EXAMPLES[("mixer", "mla")], "q_lora_rank": 8, "latent_norm": "scalenorm"},
                           {**EXAMPLES[("mixer", "mla")], "window": 4,  # an indexer reading the block input
                            "indexer": {"kind": "lightning", "topk": 3, "head_dim": 8, "n_heads": 2}}],
    ("mixer", "compressed"): [{**EXAMPLES[("mixer", "compressed")], "compress_rate": 4, "overlap": True,
                                   "index_heads": 2, "index_head_dim": 8, "out_groups": 2, "out_rank": 3},
                                  {**EXAMPLES[("mixer", "compressed")], "compress_rate": 2, "sinks": False}],
    ("mixer", "parallel"): [
        {"mixers": [{"kind": "attention", "n_heads": 4}, {"kind": "attention", "n_heads": 2}]},  # two caches
        {"mixers": [{"kind": "gated_deltanet", "n_heads": 4}, {"kind": "short_conv"}]},  # two states
        {"mixers": [{"kind": "short_conv"}, {**EXAMPLES[("mixer", "mla")], "kind": "mla"}]},  # a latent lead
    ],
    ("ffn", "mlp"): [{"hidden": 8, "activation": "xielu", "bias": False}],  # a learned activation's two scalars
    ("ffn", "moe"): [{"n_experts": 6, "top_k": 4, "router": {"kind": "sigmoid_topk", "n_group": 4, "topk_group": 1}},
                     {"n_experts": 4, "top_k": 2, "gated": False, "n_shared_experts": 2, "expert_bias": True},
                     {"n_experts": 4, "top_k": 2, "router": {"kind": "hash"}}],  # a router sized by the vocabulary
    ("positional", "rope"): [{"fraction": 0.5, "scaling": {"kind": "dynamic", "factor": 2.0}},
                             {"scaling": {"kind": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4,
                                          "original_context_length": 8}}],
}


def _variants(c: Component) -> list[dict[str, Any]]:
    """The example params, each changed param of the component contract test, and :data:`MORE`."""
    base = dict(EXAMPLES.get((c.kind, c.name), {}))
    variants = [base, *MORE.get((c.kind, c.name), [])]
    for (kind, name, _field), change in CHANGES.items():
        if (kind, name) == (c.kind, c.name):
            value, others = change if isinstance(change, tuple) else (change, {})
            variants.append({**base, **others, _field: value})
    for field, info in c.params.model_fields.items():  # the other side of every boolean
        if info.annotation is bool:
            variants.append({**base, field: not info.get_default()})
    return variants


def _sizes(c: Component, registry: Any) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Pairs (sizes for the constructor, the same sizes for the check) for ``c``'s kind."""
    if c.kind != "layout":
        return [(dict(s), dict(s)) for s in GRID[c.kind]]
    pairs = []
    norm = registry.resolve("norm", {"kind": "rmsnorm"})
    for attention, ffn, residual, width in itertools.product(SUBLAYERS["mixer"], SUBLAYERS["ffn"],
                                                            SUBLAYERS["residual"], (0, 4)):
        a, f = registry.resolve("mixer", attention), registry.resolve("ffn", ffn)
        stream = registry.resolve("residual", residual)
        common = {"d_model": 8, "layer_index": 1, "n_layers": 2, "per_layer_input": width}
        module_stream, sized_stream = stream.make(d_model=8), stream.sized(d_model=8)
        built = {**common, "mixer": a.make(d_model=8), "ffn": f.make(d_model=8),
                 "make_norm": lambda dim=8: norm.make(dim=dim), "make_residual": module_stream.connection}
        checked = {**common, "mixer": a.sized(d_model=8), "ffn": f.sized(d_model=8),
                   "make_norm": lambda dim=8: norm.sized(dim=dim),
                   "make_residual": lambda sized_stream=sized_stream: SIZED.connection(sized_stream)}
        pairs.append((built, checked))
    return pairs


def _built(resolved: Any, sizes: dict[str, Any]) -> tuple[Any, str | None]:
    torch.manual_seed(0)
    try:
        return resolved.make(**sizes), None
    except (ValueError, TypeError) as exc:
        return None, first_line(exc)


def _checked(resolved: Any, sizes: dict[str, Any]) -> tuple[Sized | None, str | None]:
    try:
        return resolved.sized(**sizes), None
    except (ValueError, TypeError) as exc:
        return None, first_line(exc)


def disagreements(c: Component, resolved: Any, built_sizes: dict[str, Any], checked_sizes: dict[str, Any]) -> list[str]:
    """Where the declared check and the constructor differ for these params and sizes (empty: they agree)."""
    module, built_error = _built(resolved, built_sizes)
    facts, check_error = _checked(resolved, checked_sizes)
    if built_error or check_error:
        return [] if built_error == check_error else [f"constructor: {built_error!r}, check: {check_error!r}"]
    assert module is not None and facts is not None
    seen = facts_of(module)
    fields = ["parameters"]
    if c.kind == "mixer":
        fields += ["n_heads", "n_kv_heads", "head_dim", "uses_positions", "caches_tokens", "keeps_state", "absent",
                   "kv_from", "window"]
    if c.kind == "per_layer_input":
        fields += ["width"]
    if c.kind == "layout":
        fields += ["per_layer_width"]
    if c.kind == "ffn":
        fields += ["absent"]
    if c.kind == "positional":
        fields += ["adds_to_embeddings"]
    if c.kind == "residual":
        fields += ["n_streams"]
    found = [f"{f}: module {getattr(seen, f)!r}, check {getattr(facts, f)!r}"
             for f in fields if getattr(seen, f) != getattr(facts, f)]
    if c.kind == "residual":  # each connection a block makes
        made, declared = seen.connection, facts.connection
        for f in ("parameters", "n_streams"):
            if declared is None or getattr(made, f) != getattr(declared, f):
                found.append(f"connection {f}: module {getattr(made, f)!r}, check {getattr(declared, f, None)!r}")
    # A mixer without heads has no positional width (n_heads and head_dim are compared above).
    if c.kind == "mixer" and heads_of(seen) is not None and positional_dim_of(seen) != positional_dim_of(facts):
        found.append(f"positional width: module {positional_dim_of(seen)}, check {positional_dim_of(facts)}")
    if c.kind == "mixer" and cache_slots_of(seen) != cache_slots_of(facts):
        found.append(f"cache slots: module {cache_slots_of(seen)}, check {cache_slots_of(facts)}")
    return found


MODEL_COMPONENTS = [c for c in get_registry() if c.kind in MODEL_KINDS]


@pytest.mark.parametrize("component", MODEL_COMPONENTS, ids=lambda c: f"{c.kind}-{c.name}")
def test_the_declared_size_check_accepts_exactly_what_the_constructor_builds(component: Component) -> None:
    registry = get_registry()
    problems, accepted, refused = [], 0, 0
    for params in _variants(component):
        try:
            resolved = registry.resolve(component.kind, {"kind": component.name, **params})
        except ValidationError:
            continue  # a change that needs other params: the contract test's business
        for built_sizes, checked_sizes in _sizes(component, registry):
            found = disagreements(component, resolved, built_sizes, checked_sizes)
            problems += [f"{params} at {checked_sizes}: {f}" for f in found]
            refused += _checked(resolved, checked_sizes)[1] is not None
            accepted += _checked(resolved, checked_sizes)[1] is None
    assert not problems, "\n".join(problems[:10])
    assert accepted, "no size in the grid was accepted: the check was never compared with a module"


@pytest.mark.parametrize("component", MODEL_COMPONENTS, ids=lambda c: f"{c.kind}-{c.name}")
def test_every_built_in_model_component_declares_its_size_check(component: Component) -> None:
    assert component.params.sized is not Params.sized, (
        f"{component.kind} {component.name!r}: {component.params.__name__} declares no sized(); validating a spec "
        f"that uses it would import torch to build it")


def test_a_check_that_accepts_what_the_constructor_refuses_is_caught() -> None:
    """The comparison above can fail: a planted check that forgot a divisibility rule."""
    registry = get_registry()
    component = registry.get("mixer", "attention")
    resolved = registry.resolve("mixer", {"kind": "attention", "n_heads": 4})

    class Forgetful:
        def __init__(self, real: Any) -> None:
            self.component, self.params, self.make = real.component, real.params, real.make

        def sized(self, *, d_model: int, **_: Any) -> Sized:
            return Sized(parameters=0, n_heads=4, head_dim=d_model // 4)

    sizes = {"d_model": 30, "layer_index": 0, "n_layers": 1}  # 4 heads cannot split 30
    found = disagreements(component, Forgetful(resolved), sizes, sizes)
    assert found and "must divide d_model" in found[0]


def test_every_example_spec_counts_its_parameters_without_torch_as_the_meta_build(tmp_path) -> None:
    """The torch-free count (the 2^63-byte check) equals the meta estimate's for every spec in specs/."""
    for path in sorted(SPECS.glob("*.*")):
        checked = check_spec(path)
        assert checked.sizes is not None and checked.sizes.parameters == checked.shape.parameters, path


@pytest.mark.parametrize("block", [
    {"residual": {"kind": "mhc", "n_streams": 3}, "layout": "parallel"},
    {"residual": {"kind": "mhc", "n_streams": 2}, "mixer": "none"},
    {"ffn": {"kind": "moe", "n_experts": 4, "top_k": 2, "hidden": 8, "router": {"kind": "hash"}}},
], ids=["hyper-connections", "hyper-connections-no-mixer", "hash-router"])
def test_a_spec_on_several_streams_or_routed_by_token_counts_its_parameters_as_the_meta_build(block) -> None:
    """No example spec has them: the stream's head and each block's connections, a router sized by the vocabulary."""
    checked = check_spec(_tiny(**block))
    assert checked.sizes.parameters == checked.shape.parameters


def _tiny(**block: Any) -> dict[str, Any]:
    spec = {"model": {**TINY["model"], "block": {**TINY["model"]["block"], **block}}}
    return spec


def _sharing(*layers: dict[str, Any]) -> dict[str, Any]:
    spec = _tiny()
    spec["model"] = {**spec["model"], "n_layers": 3, "layers": list(layers)}
    return spec


@pytest.mark.parametrize("spec, found", [
    (_tiny(layout="postnorm", residual={"kind": "mhc", "n_streams": 2}),
     "model.block.layout: postnorm normalises the residual stream itself"),
    (_sharing({"select": 0, "mixer": {"n_kv_heads": 4}}, {"select": 2, "mixer": {"kv_from": 0}}),
     "model.layers[1].mixer.kv_from: layer 0 keeps keys of 4 heads"),
    (_sharing({"select": 0, "mixer": {"kind": "gated_deltanet", "n_heads": 4}},
              {"select": 2, "mixer": {"kv_from": 0}}),
     "layer 0 (GatedDeltaNet) keeps no keys and values to share"),
    (_sharing({"select": 1, "mixer": {"kv_from": 0}}, {"select": 2, "mixer": {"kv_from": 1}}),
     "layer 1 itself reads layer 0's keys and values"),
    (_sharing({"select": 0, "mixer": {"window": 4}}, {"select": 2, "mixer": {"kv_from": 0}}),
     "layer 0 keeps only its last 4 tokens (its window)"),
    ({"model": {**_tiny()["model"], "per_layer_input": {"kind": "per_layer_embedding", "width": 4}}},
     "model.block.layout: model.per_layer_input gives every block a per-layer input, and the 'prenorm' layout takes none"),
    ({"model": {**_tiny(layout="sandwich", residual={"kind": "mhc", "n_streams": 2})["model"],
                "per_layer_input": {"kind": "per_layer_embedding", "width": 4}}},
     "a per-layer input acts on a single residual stream"),
], ids=["postnorm-streams", "kv-heads", "kv-recurrent", "kv-chained", "kv-window", "per-layer-prenorm",
        "per-layer-streams"])
def test_a_spec_the_build_refuses_is_refused_by_the_size_check_in_the_same_words(spec, found) -> None:
    from specformer.model.sizes import estimate_resolved
    from specformer.spec.size_check import check_sizes
    from specformer.spec.validate import validate

    resolved = validate(spec, registry=get_registry()).resolved
    with pytest.raises(SpecError) as checked:
        check_sizes(resolved)
    with pytest.raises(SpecError) as built:
        estimate_resolved(resolved)
    assert str(checked.value) == str(built.value)
    assert found in str(checked.value)


def test_a_model_with_per_layer_inputs_counts_its_parameters_as_the_meta_build() -> None:
    spec = {"model": {**_tiny(layout={"kind": "sandwich", "layer_scale": True})["model"],
                      "per_layer_input": {"kind": "per_layer_embedding", "width": 4}}}
    checked = check_spec(spec)
    assert checked.sizes.parameters == checked.shape.parameters
    assert checked.sizes.parameters > check_spec(_tiny(layout="sandwich")).sizes.parameters


# -- a third-party component that declares no check ----------------------------------------------


class OddNormParams(BaseModel):
    """A norm that refuses an odd width, declaring no size check (plain pydantic, no Params base)."""

    model_config = ConfigDict(extra="forbid")
    eps: float = Field(default=1e-5, gt=0)


class OddNorm(nn.Module):
    def __init__(self, params: OddNormParams, *, dim: int) -> None:
        super().__init__()
        if dim % 2:
            raise ValueError(f"oddnorm needs an even width, got {dim}")
        self.weight = nn.Parameter(torch.ones(dim))


class MyLayoutParams(Params):
    """A pre-norm block written without a size check."""


class MyLayout(nn.Module):
    def __init__(self, params: MyLayoutParams, *, mixer: nn.Module, ffn: nn.Module, make_norm: Any) -> None:
        super().__init__()
        self.mixer, self.ffn = mixer, ffn
        self.attention_norm, self.ffn_norm = make_norm(), make_norm()
        self.gain = nn.Parameter(torch.ones(1))


class GainedStreamParams(Params):
    """One stream whose connections scale each output by a learned gain; it declares the stream, not the connections."""

    def sized(self, *, d_model: int) -> Sized:
        return Sized(parameters=0)


class GainedConnection(ResidualConnection):
    def __init__(self) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.ones(1))

    def write(self, stream: torch.Tensor, *outputs: torch.Tensor, mix: Any = None) -> torch.Tensor:
        return super().write(stream, *(self.gain * out for out in outputs))


class GainedStream(ResidualStream):
    def __init__(self, params: GainedStreamParams, *, d_model: int) -> None:
        super().__init__()

    def connection(self) -> ResidualConnection:
        return GainedConnection()


def _registry_with_undeclared() -> Any:
    registry = build_registry(get_plugin_manager())
    registry.register("norm", "oddnorm", factory=OddNorm, params=OddNormParams, plugin="mine")
    registry.register("layout", "mine", factory=MyLayout, params=MyLayoutParams, plugin="mine")
    registry.register("residual", "gained", factory=GainedStream, params=GainedStreamParams, plugin="mine")
    return registry


def test_a_stream_that_does_not_declare_its_connections_has_them_built_on_meta() -> None:
    checked = check_spec(_tiny(residual="gained"), registry=_registry_with_undeclared())
    assert checked.sizes.parameters == checked.shape.parameters
    plain = check_spec(_tiny()).sizes.parameters
    assert checked.sizes.parameters == plain + 2 * TINY["model"]["n_layers"]  # a gain per connection, two a block



def test_a_component_without_a_size_check_is_checked_by_building_it_on_meta() -> None:
    registry = _registry_with_undeclared()
    d_model = TINY["model"]["d_model"]
    odd = {"model": {**_tiny(norm="oddnorm")["model"], "d_model": d_model + 1, "block": {
        **TINY["model"]["block"], "norm": "oddnorm", "mixer": {"kind": "attention", "n_heads": 1}}}}
    with pytest.raises(SpecError) as info:
        check_spec(odd, registry=registry)
    assert str(info.value).strip().endswith(f"model.block.norm: oddnorm needs an even width, got {d_model + 1}")
    # Accepted, and counted: the undeclared layout is built around sublayers that were only checked.
    checked = check_spec(_tiny(norm="oddnorm", layout="mine"), registry=registry)
    assert checked.sizes.parameters == checked.shape.parameters == estimate(checked.spec, registry=registry).parameters


def test_a_sized_that_returns_something_else_is_a_plugin_error() -> None:
    from specformer.errors import RegistryError

    class WrongParams(Params):
        def sized(self, *, dim: int) -> Any:
            return {"parameters": dim}

    registry = build_registry(get_plugin_manager())
    registry.register("norm", "wrong", factory=OddNorm, params=WrongParams, plugin="mine")
    with pytest.raises(RegistryError, match="WrongParams.sized returned dict, not a Sized"):
        check_spec(_tiny(norm="wrong"), registry=registry)


def test_sandwich_residual_gates_count_as_the_meta_build() -> None:
    # Two d_model vectors per block (Ergo's residual gates), in the size check as in the built model.
    checked = check_spec(_tiny(layout={"kind": "sandwich", "residual_gate": True}))
    assert checked.sizes.parameters == checked.shape.parameters
    assert checked.sizes.parameters > check_spec(_tiny(layout="sandwich")).sizes.parameters
