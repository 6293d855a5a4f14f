"""The component convention, checked for every registered component of every plugin.

Each param and its default exist once, in the component's ``Params`` model, and listing
components never imports torch (CONVENTION of issue 30, docs/writing-a-plugin.md):

- the registry holds the factory as a ``"module:Name"`` path, which imports and accepts
  ``(params, **the sizes of its kind it names)``; the factory is the component class
  itself (or a function), never a ``from_params`` classmethod;
- no param is repeated in the factory's signature with a default of its own;
- the module defining the ``Params`` model imports no torch, directly or through the
  project modules it imports (read from the source, so the core's own package imports
  do not hide a plugin's mistake);
- built from a spec (``registry.resolve(...).make(**sizes)``) and from Python
  (``factory(Params(...), **sizes)``, or with no params at all) a component is the same
  object: same class, parameter names, shapes and values under the same seed, same
  ``repr`` (every ``extra_repr`` in it) and same settings;
- every param takes effect: changing it from its default changes what is built (a
  constructor that ignored a param would pass every other check);
- every token mixer (the ``attention`` kind: softmax attention and recurrent mixers alike),
  in a two-layer model beside softmax attention, gives through the generation cache what
  recompute gives: token-by-token decoding, left-padded ragged prompts, beam search (states
  and keys reordered) and speculative decoding (rolled back to the last kept draft);
- every residual stream (the ``residual`` kind) keeps the contract of
  :mod:`specformer.model.residual`: its connections read ``(B, T, d_model)`` for the sublayer
  and write a stream of the shape they read, its collapse gives back ``(B, T, d_model)``, and
  a model on it decodes through the generation cache as it recomputes, under every layout
  that accepts it.

Components of kinds whose sizes are a training run's objects (optimizers, loggers) get the
structural checks only.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import typing
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError
from torch import nn

from specformer.registry.discovery import build_registry, get_plugin_manager, get_registry
from specformer.registry.components import Component
from specformer.model.residual import ResidualConnection, ResidualStream

ROTARY_DIM = 64  # wide enough that YaRN's ramp bounds move with its betas
PAIRS = ROTARY_DIM // 2


def _sizes(kind: str) -> dict[str, Any] | None:
    """The sizes the builder would pass a component of ``kind`` (fresh modules on every call); None: not built here."""
    if kind == "layout":
        return {"d_model": 4, "mixer": nn.Linear(4, 4), "ffn": nn.Linear(4, 4),
                "make_norm": lambda: nn.LayerNorm(4), "make_residual": ResidualConnection, "layer_index": 1,
                "n_layers": 2, "per_layer_input": 3}
    return {
        "residual": {"d_model": 8},
        "positional": {"d_model": 32, "n_heads": 4, "head_dim": 8, "context_length": 32},
        "norm": {"dim": 8},
        "ffn": {"d_model": 32, "layer_index": 1, "n_layers": 2, "vocab_size": 50},
        "mixer": {"d_model": 32, "layer_index": 1, "n_layers": 2, "context_length": 32},
        "rope_scaling": {"rotary_dim": ROTARY_DIM, "theta": 10000.0, "context_length": 16384},
        "router": {"d_model": 16, "n_experts": 4, "top_k": 2, "vocab_size": 50},
        "indexer": {"d_model": 32, "query_dim": 8, "positional_dim": 8},
        "linear": {"in_features": 8, "out_features": 6, "bias": True, "splits": (2, 4)},
        "per_layer_input": {"vocab_size": 11, "d_model": 8, "n_layers": 2},
        "sampler": {}, "quantization": {}, "adapter": {},
    }.get(kind)


#: Example params of components whose Params have required fields (or need some to build at these sizes).
EXAMPLES: dict[tuple[str, str], dict[str, Any]] = {
    ("mixer", "attention"): {"n_heads": 4},
    ("mixer", "mla"): {"n_heads": 4, "kv_lora_rank": 8, "qk_rope_head_dim": 8, "qk_nope_head_dim": 4,
                           "v_head_dim": 8},
    ("mixer", "compressed"): {"n_heads": 4, "head_dim": 16, "q_lora_rank": 8, "rope_dim": 8, "window": 3,
                                  "compress_rate": 2, "overlap": True, "index_heads": 2, "index_head_dim": 8,
                                  "index_topk": 2, "out_groups": 2, "out_rank": 4},
    ("mixer", "kda"): {"n_heads": 4},
    ("mixer", "gated_deltanet"): {"n_heads": 4},
    ("mixer", "parallel"): {"mixers": [{"kind": "attention", "n_heads": 4},
                                           {"kind": "mamba2", "n_heads": 4, "head_dim": 8, "state_size": 8}]},
    ("mixer", "mamba2"): {"n_heads": 4, "head_dim": 8, "state_size": 8},
    ("mixer", "mamba"): {"d_inner": 16, "state_size": 4},
    ("mixer", "rglru"): {"width": 16},
    ("mixer", "lightning"): {"n_heads": 4},
    ("mixer", "mlstm"): {"n_heads": 2},
    ("mixer", "moa"): {"n_experts": 4, "top_k": 2, "n_kv_heads": 2},
    ("mixer", "cca"): {"n_heads": 4, "n_kv_heads": 2},
    ("ffn", "moe"): {"n_experts": 4, "top_k": 2, "hidden": 16},
    ("indexer", "lightning"): {"topk": 3, "n_heads": 4, "head_dim": 12},
    ("indexer", "block_pooled"): {"block_size": 2, "topk": 1},
    ("ffn", "parallel"): {"ffns": [{"kind": "geglu", "hidden": 16}, {"kind": "moe", "n_experts": 4, "top_k": 2,
                                                                     "hidden": 8}]},
    ("per_layer_input", "per_layer_embedding"): {"width": 4},
    ("rope_scaling", "linear"): {"factor": 2.0},
    ("rope_scaling", "proportional"): {"fraction": 0.25},
    ("rope_scaling", "dynamic"): {"factor": 2.0},
    ("rope_scaling", "yarn"): {"original_context_length": 4096},
    ("rope_scaling", "longrope"): {"short_factor": [1.0 + i / 10 for i in range(PAIRS)],
                                   "long_factor": [2.0 + i for i in range(PAIRS)], "original_context_length": 4096},
    ("sampler", "frequency_penalty"): {"penalty": 0.5},
    ("sampler", "presence_penalty"): {"penalty": 0.5},
    ("sampler", "repetition_penalty"): {"penalty": 1.2},
    ("sampler", "min_p"): {"p": 0.1},
    ("sampler", "no_repeat_ngram"): {"n": 3},
    ("sampler", "temperature"): {"value": 0.7},
    ("sampler", "top_k"): {"k": 5},
    ("sampler", "top_p"): {"p": 0.9},
    ("sampler", "regex"): {"pattern": "[ab]+"},
    ("sampler", "choice"): {"options": ["yes", "no"]},
    ("sampler", "json_schema"): {"schema": {"type": "object"}},
    ("sampler", "grammar"): {"lark": 'start: "a"+'},
    ("sampler", "typical"): {"p": 0.9},
}

#: A changed value for params no rule below can pick one for, optionally with the other params
#: it needs to show (``(value, {other: value})``): e.g. qk_norm_scope matters only with a qk_norm.
CHANGES: dict[tuple[str, str, str], Any] = {
    ("sampler", "regex", "pattern"): "[cd]+",
    ("sampler", "choice", "options"): ["maybe"],
    ("sampler", "json_schema", "schema"): {"type": "array"},
    ("sampler", "grammar", "lark"): 'start: "b"+',
    ("mixer", "attention", "n_kv_heads"): 2,
    ("mixer", "attention", "head_dim"): 4,
    ("mixer", "attention", "input_width"): 48,
    ("mixer", "attention", "window"): 8,
    ("mixer", "attention", "qk_norm"): "rmsnorm",
    ("mixer", "attention", "qk_norm_scope"): ("all", {"qk_norm": "rmsnorm"}),
    ("mixer", "attention", "qk_norm_order"): ("after_rope", {"qk_norm": "rmsnorm"}),
    ("mixer", "attention", "out_norm"): "rmsnorm",
    ("mixer", "attention", "linear"): "bitlinear",
    ("ffn", "swiglu", "inner_norm"): "rmsnorm",
    ("ffn", "swiglu", "linear"): "bitlinear",
    ("ffn", "geglu", "inner_norm"): "rmsnorm",
    ("ffn", "geglu", "linear"): "bitlinear",
    ("ffn", "reglu", "inner_norm"): "rmsnorm",
    ("ffn", "reglu", "linear"): "bitlinear",
    ("linear", "bitlinear", "eps"): 10.0,  # above the tiny inputs' max|x|: the int8 grid's step grows
    ("ffn", "mlp", "activation"): "xielu",  # a learned activation component in place of the fixed gelu
    ("mixer", "attention", "logit_softcap"): 30.0,
    ("mixer", "attention", "scale"): 0.5,
    ("mixer", "attention", "chunk"): 8,
    ("mixer", "attention", "temperature_floor_scale"): (16, {"temperature_tuning": True}),
    ("mixer", "attention", "temperature_attn_scale"): (0.5, {"temperature_tuning": True}),
    ("mixer", "attention", "temperature_position_offset"): (0, {"temperature_tuning": True, "temperature_floor_scale": 2}),
    ("mixer", "attention", "query_length_scale_base"): (4, {"query_length_scale": True}),
    ("mixer", "attention", "query_length_scale_exponent"): (0.5, {"query_length_scale": True}),
    ("mixer", "attention", "kv_from"): 0,  # the sizes build layer 1, so layer 0 is the one earlier layer
    ("mixer", "attention", "v_norm"): "rmsnorm",
    ("mixer", "attention", "v_head_dim"): 6,  # wider than the tiny heads, so the value rows and cache change
    ("mixer", "attention", "value_scale"): 0.5,
    ("mixer", "attention", "clip_qkv"): 0.05,  # below the tiny projections' largest values, so it clamps
    ("mixer", "attention", "clip_qkv_order"): ("after_qk_norm", {"clip_qkv": 0.05, "qk_norm": "rmsnorm", "qk_norm_scope": "all"}),
    ("mixer", "attention", "output_gate_scope"): ("head", {"output_gate": True}),
    ("mixer", "attention", "output_gate_activation"): ("softplus", {"output_gate": True}),
    ("mixer", "attention", "output_gate_bias"): ("head", {"output_gate": True}),
    ("mixer", "attention", "differential_norm"): ("rmsnorm", {"differential": True}),  # a norm with a weight
    ("per_layer_input", "per_layer_embedding", "vocab_size"): 7,
    ("per_layer_input", "per_layer_embedding", "norm"): "layernorm",
    ("norm", "prediction_head", "norm"): "rmsnorm",
    ("norm", "gated", "norm"): "layernorm",
    ("norm", "gated", "rank"): 3,
    ("norm", "gated", "activation"): "gelu",
    ("mixer", "parallel", "mixers"): [{"kind": "attention", "n_heads": 2}],
    ("mixer", "parallel", "in_multipliers"): [0.5, 2.0],
    ("mixer", "parallel", "out_multipliers"): [2.0, 0.5],
    ("mixer", "mamba2", "dt_max"): 0.1,
    ("mixer", "mamba2", "projection_multipliers"): [1.0, 2.0, 0.5, 1.5, 0.25],
    ("mixer", "mamba", "bcdt_norm_eps"): 1e-3,
    ("mixer", "mamba", "dt_rank"): 3,
    ("mixer", "mamba", "bcdt_norm_weights"): (True, {"bcdt_norm_eps": 1e-3}),
    ("mixer", "rglru", "gate_blocks"): 4,
    ("mixer", "rwkv4", "width"): 24,
    ("mixer", "lightning", "head_dim"): 4,
    ("mixer", "cca", "head_dim"): 4,
    ("mixer", "cca", "window"): 8,
    ("mixer", "mlstm", "qk_dim"): 4,
    ("mixer", "mlstm", "v_dim"): 4,
    ("mixer", "mlstm", "gate_soft_cap"): 5.0,
    ("layout", "prenorm", "residual_scales"): [2.0, 1.0],
    ("layout", "prenorm", "output_scales"): [0.5, 1.0],
    ("mixer", "mla", "q_lora_rank"): 8,
    ("mixer", "mla", "latent_norm"): "layernorm",
    ("mixer", "mla", "window"): 8,
    ("mixer", "mla", "scale"): 0.5,
    ("mixer", "mla", "yarn_factor"): (4.0, {"yarn_mscale_all_dim": 1.0}),
    ("mixer", "mla", "yarn_mscale_all_dim"): (1.0, {"yarn_factor": 4.0}),
    ("mixer", "mla", "indexer"): ({"kind": "lightning", "topk": 3}, {"q_lora_rank": 8}),
    ("mixer", "attention", "indexer"): {"kind": "block_pooled", "block_size": 2, "topk": 1},
    ("indexer", "block_pooled", "n_heads"): 2,
    ("mixer", "mla", "output_gate"): True,
    ("mixer", "mla", "output_gate_scope"): ("channel", {"output_gate": True}),
    ("mixer", "mla", "output_gate_input"): ("query_latent", {"output_gate": True, "q_lora_rank": 8}),
    ("mixer", "mla", "q_up_input"): ("normed_and_raw", {"q_lora_rank": 8}),
    ("layout", "prenorm", "ffn_norm"): "layernorm",
    ("indexer", "lightning", "key_norm"): "rmsnorm",
    ("mixer", "compressed", "norm"): "layernorm",
    ("mixer", "moa", "head_dim"): 4,
    ("mixer", "moa", "scale"): 0.5,
    ("mixer", "moa", "router"): {"kind": "sigmoid_topk"},
    ("mixer", "compressed", "compress_rate"): 3,
    ("mixer", "compressed", "out_groups"): (4, {"out_rank": 4}),
    ("mixer", "compressed", "out_rank"): 2,
    ("mixer", "kda", "head_dim"): 4,
    ("mixer", "kda", "value_head_dim"): 4,
    ("mixer", "kda", "decay_rank"): 4,
    ("mixer", "kda", "gate_rank"): 4,
    ("mixer", "kda", "decay_bound"): -5.0,
    ("mixer", "gated_deltanet", "n_key_heads"): 2,
    ("mixer", "gated_deltanet", "key_head_dim"): 4,
    ("mixer", "gated_deltanet", "value_head_dim"): 4,
    ("mixer", "gated_deltanet", "a_init_range"): [1.0, 2.0],
    ("mixer", "gated_deltanet", "dt_init_range"): [0.001, 0.1],
    ("mixer", "gated_deltanet", "dt_init_floor"): (0.05, {"dt_init_range": [0.001, 0.1]}),
    ("ffn", "mlp", "hidden"): 16,
    ("ffn", "swiglu", "hidden"): 16,
    ("ffn", "geglu", "hidden"): 16,
    ("ffn", "reglu", "hidden"): 16,
    ("ffn", "rwkv_channel_mix", "hidden"): 16,
    ("ffn", "moe", "router"): {"kind": "sigmoid_topk"},
    ("ffn", "parallel", "ffns"): [{"kind": "mlp", "hidden": 16}, {"kind": "geglu", "hidden": 8}],
    ("ffn", "parallel", "norm"): "layernorm",
    ("ffn", "moe", "normalize_topk"): False,
    ("ffn", "moe", "swiglu_limit"): 7.0,
    ("ffn", "moe", "swiglu_alpha"): (2.0, {"swiglu_limit": 7.0}),
    ("ffn", "moe", "swiglu_style"): ("silu", {"swiglu_limit": 7.0}),
    ("ffn", "moe", "shared_hidden"): (24, {"n_shared_experts": 1}),
    ("ffn", "moe", "shared_gate"): (True, {"n_shared_experts": 1}),
    ("ffn", "moe", "shared_combine"): ("average", {"n_shared_experts": 1}),
    ("ffn", "moe", "output_norm"): "rmsnorm",
    ("ffn", "moe", "expert_norm"): ("rmsnorm", {"n_shared_experts": 1}),
    ("positional", "rope", "scaling"): {"kind": "linear", "factor": 2.0},
    ("positional", "rope", "fraction"): 0.5,
    ("rope_scaling", "dynamic", "original_context_length"): 4096,
    ("rope_scaling", "yarn", "factor"): 2.0,
    ("rope_scaling", "yarn", "mscale"): (0.7, {"mscale_all_dim": 1.0}),
    ("rope_scaling", "yarn", "mscale_all_dim"): (0.5, {"mscale": 1.0}),
    ("rope_scaling", "yarn", "attention_factor"): 1.5,
    ("rope_scaling", "longrope", "factor"): 2.0,
    ("rope_scaling", "longrope", "attention_factor"): 1.5,
    ("router", "softmax_topk", "topk_group"): (2, {"n_group": 2}),
    ("router", "sigmoid_topk", "topk_group"): (2, {"n_group": 2}),
    ("router", "sigmoid_topk", "logit_softcap"): 0.5,
    ("router", "sqrtsoftplus_topk", "logit_softcap"): 0.5,
    ("router", "biased_softmax_topk", "logit_softcap"): 0.5,
    ("router", "sqrtsoftplus_topk", "topk_group"): (2, {"n_group": 2}),
    ("router", "biased_softmax_topk", "topk_group"): (2, {"n_group": 2}),
    ("rope_scaling", "longrope", "short_factor"): [1.5] * PAIRS,
    ("rope_scaling", "longrope", "long_factor"): [3.0] * PAIRS,
    ("layout", "parallel", "shared_norm"): True,
    ("adapter", "lora", "targets"): ["mixer.qkv"],
    ("adapter", "lora", "base"): "int8",
}

#: Params that legitimately change nothing that is built, and why.
NO_VISIBLE_EFFECT: dict[tuple[str, str, str], str] = {
    ("ffn", "moe", "routing"): "topk_then_softmax is by definition the normalised softmax_then_topk (the only "
                               "normalize_topk it accepts), so both build the same router",
}


def _fresh_registry() -> Any:
    """A registry filled anew from the plugins' hooks (what a fresh process lists)."""
    return build_registry(get_plugin_manager())


ALL = list(get_registry())


def _id(c: Component) -> str:
    return f"{c.kind}-{c.name}"


def _convention(components: list[Component], check: str | None = None) -> list[Any]:
    """Each component as a test case named ``kind-name``."""
    return [pytest.param(c, id=_id(c)) for c in components]


# -- structure: registration by path, the factory's signature, torch-free Params -----------------


@pytest.mark.parametrize("component", _convention(ALL, "path"))
def test_registered_by_path_and_the_factory_takes_params_and_its_sizes(component: Component) -> None:
    fresh = _fresh_registry().get(component.kind, component.name)
    assert isinstance(fresh.factory_ref, str), f"register {component.kind} {component.name!r} by 'module:Name' path"
    factory = fresh.factory  # imports
    assert not inspect.ismethod(factory), f"{fresh.factory_path}: the class (or a function) is the factory, not a classmethod"
    signature = inspect.signature(factory)
    sizes = _get_kind_sizes(component.kind)
    named = {n for n in signature.parameters if n in sizes}
    signature.bind(component.params.model_construct(), **{n: None for n in named})  # raises if it cannot take them
    others = [p for p in list(signature.parameters.values())[1:] if p.name not in sizes]
    assert all(p.default is not inspect.Parameter.empty for p in others), \
        f"{fresh.factory_path}{signature}: everything but params and sizes of {component.kind!r} needs a default"


@pytest.mark.parametrize("component", _convention(ALL, "repeated"))
def test_no_param_is_repeated_in_the_constructor(component: Component) -> None:
    factory = component.factory
    if inspect.ismethod(factory) and inspect.isclass(factory.__self__):  # the old from_params: look at the class
        factory = factory.__self__
    target = factory.__init__ if inspect.isclass(factory) else factory
    # A size of the kind may share a name with a param that overrides it (an optimizer's betas over train.betas):
    # the kind declares the size, the component its param, each once.
    sizes = set(get_registry().kinds[component.kind].sizes)
    repeated = sorted((set(inspect.signature(target).parameters) - sizes) & set(component.params.model_fields))
    assert not repeated, f"{component.factory_path} repeats params of {component.params.__name__}: {repeated}"


@pytest.mark.parametrize("component", _convention(ALL))
def test_a_component_class_names_its_params(component: Component) -> None:
    factory = component.factory
    if inspect.ismethod(factory) and inspect.isclass(factory.__self__):
        factory = factory.__self__
    if inspect.isclass(factory):
        assert issubclass(component.params, factory.Params), \
            f"{component.factory_path}.Params should be {component.params.__name__} (or its base)"


@pytest.mark.parametrize("component", _convention(ALL, "params_module"))
def test_the_params_module_imports_no_torch(component: Component) -> None:
    chain = _torch_import_chain(component.params.__module__)
    assert chain is None, f"{component.params.__name__}'s module imports torch: {' -> '.join(chain)}"


def _get_kind_sizes(kind: str) -> tuple[str, ...]:
    return get_registry().kinds[kind].sizes


#: The core package's ``__init__`` imports the builder, hence torch, today: that is the core's
#: to change (issue 29, start-up). A Params module is judged by the modules it names itself.
CORE_PACKAGE = "specformer"


def _torch_import_chain(module: str, seen: set[str] | None = None) -> list[str] | None:
    """The chain of module-level imports from ``module`` to torch, following this project's modules; None if none."""
    seen = {CORE_PACKAGE} if seen is None else seen
    seen.add(module)
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None
    for imported in _module_level_imports(Path(spec.origin), package=module if spec.submodule_search_locations else module.rpartition(".")[0]):
        top = imported.split(".")[0]
        if top == "torch":
            return [module, imported]
        if top.startswith("specformer") and imported not in seen:
            chain = _torch_import_chain(imported, seen)
            if chain is not None:
                return [module, *chain]
    return None


def _module_level_imports(path: Path, *, package: str) -> list[str]:
    """Modules imported when ``path`` is imported (not inside functions; ``TYPE_CHECKING`` blocks skipped)."""
    out: list[str] = []

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                out.extend(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                out.append(base)
                # `from pkg import module` imports pkg.module when it is one
                if base.startswith("specformer"):
                    out.extend(f"{base}.{a.name}" for a in node.names if _is_module(f"{base}.{a.name}"))
            elif isinstance(node, ast.If) and not _is_type_checking(node.test):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return out


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


# -- behaviour: the same object from a spec and from Python; every param takes effect ------------

BUILT = [c for c in ALL if _sizes(c.kind) is not None]


def _example(c: Component) -> dict[str, Any]:
    return dict(EXAMPLES.get((c.kind, c.name), {}))


def _from_spec(c: Component, params: dict[str, Any]) -> Any:
    torch.manual_seed(0)
    return get_registry().resolve(c.kind, {"kind": c.name, **params}).make(**_sizes(c.kind))


def _from_python(c: Component, params: dict[str, Any] | None) -> Any:
    """What a Python user writes: the factory called with its Params (or none) and the sizes it names."""
    factory = c.factory
    torch.manual_seed(0)
    named = {k: v for k, v in _sizes(c.kind).items() if k in inspect.signature(factory).parameters}
    return factory(**named) if params is None else factory(c.params(**params), **named)


def _settings(obj: Any) -> dict[str, Any]:
    """Everything a built component holds: tensors by name, repr, and the plain settings of it and its parts."""
    out: dict[str, Any] = {"type": type(obj)}
    if isinstance(obj, nn.Module):
        out["repr"] = repr(obj)
        for name, t in [*obj.named_parameters(), *obj.named_buffers()]:
            out[f"tensor {name}"] = t.detach()
        parts = dict(obj.named_modules())
    else:
        parts = {"": obj}
    for prefix, part in parts.items():
        for key, value in vars(part).items():
            if key.startswith("_") or key == "training" or isinstance(value, (nn.Module, torch.Tensor)):
                continue
            out[f"{prefix}.{key}" if prefix else key] = value
    return out


def _differences(a: Any, b: Any) -> list[str]:
    sa, sb = _settings(a), _settings(b)
    keys = sorted(set(sa) | set(sb))
    return [k for k in keys if k not in sa or k not in sb or not _equal(sa[k], sb[k])]


def _equal(x: Any, y: Any) -> bool:
    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        return isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.shape == y.shape and torch.equal(x, y)
    try:
        return bool(x == y)
    except Exception:  # noqa: BLE001 - values without a usable ==: compare what they print as
        return repr(x) == repr(y)


@pytest.mark.parametrize("component", _convention(BUILT, "built"))
def test_built_from_a_spec_and_from_python_is_the_same(component: Component) -> None:
    example = _example(component)
    from_spec = _from_spec(component, example)
    assert not _differences(from_spec, _from_python(component, example))
    takes_no_params = inspect.signature(component.factory).parameters.get("params")
    if (not example and takes_no_params is not None and takes_no_params.default is None
            and getattr(component.factory, "Params", None) is component.params):
        # One default: a Python user who passes no params gets what a spec naming only the kind gets.
        assert not _differences(from_spec, _from_python(component, None)), "the constructor's own defaults drifted"


def _param_changes() -> list[Any]:
    cases = []
    for c in BUILT:
        for field in c.params.model_fields:
            key = (c.kind, c.name, field)
            marks = []
            if key in NO_VISIBLE_EFFECT:
                marks = [pytest.mark.skip(reason=NO_VISIBLE_EFFECT[key])]
            cases.append(pytest.param(c, field, id=f"{c.kind}-{c.name}-{field}", marks=marks))
    return cases


@pytest.mark.parametrize(("component", "field"), _param_changes())
def test_every_param_takes_effect(component: Component, field: str) -> None:
    base, candidates = _changed_values(component, field)
    default = _from_spec(component, base)
    tried = []
    for value in candidates:
        try:
            changed = _from_spec(component, {**base, field: value})
        except (ValidationError, ValueError) as exc:  # not a valid change at these sizes: try the next
            tried.append(f"{value!r} ({type(exc).__name__})")
            continue
        assert _differences(default, changed), \
            f"{component.kind} {component.name!r}: {field}={value!r} builds the same thing as {base.get(field, 'the default')!r}"
        return
    pytest.fail(f"no valid changed value for {field} (tried {', '.join(tried) or 'none'}): add one to CHANGES")


def _changed_values(c: Component, field: str) -> tuple[dict[str, Any], list[Any]]:
    """The params to start from and the values of ``field`` to try instead."""
    base = _example(c)
    given = CHANGES.get((c.kind, c.name, field))
    if isinstance(given, tuple):
        value, others = given
        return {**base, **others}, [value]
    if given is not None:
        return base, [given]
    info = c.params.model_fields[field]
    current = base.get(field, None if info.is_required() else info.get_default(call_default_factory=True))
    annotation = info.annotation
    if typing.get_origin(annotation) is typing.Literal:
        return base, [v for v in typing.get_args(annotation) if v != current]
    if isinstance(current, bool):
        return base, [not current]
    if isinstance(current, (int, float)):
        kind = type(current)
        options = [current * 2, current + 1, current / 2, current - 1, 0.5, 0.1, 1]
        return base, [kind(v) for v in options if kind(v) != current]
    return base, []


# -- the planted-bug check of the convention's purpose: one default ------------------------------


def test_a_constructor_default_that_drifts_from_params_is_caught() -> None:
    """The check above, on a component whose constructor falls back to its own default."""
    from specformer_layers.norms.params import RMSNormParams
    from specformer_layers.norms.rmsnorm import RMSNorm

    class Drifting(RMSNorm):
        def __init__(self, params: RMSNormParams | None = None, *, dim: int) -> None:
            super().__init__(params if params is not None else RMSNormParams(eps=1e-5), dim=dim)

    spec_built = Drifting(RMSNormParams(), dim=8)
    assert "eps" in _differences(spec_built, Drifting(dim=8))


# -- every mixer through every consumer of the cache ---------------------------------------------

#: Every mixer with its example params, and variants whose sub-parts change what the cache keeps:
#: latent attention with an indexer (its keys ride in the cache; 3 of up to 11 keys are read); differential
#: attention (pairs of heads combined after attention reads the cache); block-pooled attention (it rescans the cached keys).
MIXERS = [pytest.param((c, _example(c)), id=_id(c)) for c in BUILT if c.kind == "mixer"] + [
    pytest.param((c, {**_example(c), "q_lora_rank": 8,
                      "indexer": {"kind": "lightning", "topk": 3, "n_heads": 4, "head_dim": 12, "block": 4}}),
                 id="attention-mla-indexer")
    for c in BUILT if (c.kind, c.name) == ("mixer", "mla")
] + [
    pytest.param((c, {**_example(c), "n_kv_heads": 2, "differential": True}), id="attention-differential")
    for c in BUILT if (c.kind, c.name) == ("mixer", "attention")
] + [
    pytest.param((c, {**_example(c), "n_kv_heads": 2,
                      "indexer": {"kind": "block_pooled", "block_size": 2, "topk": 1, "sink_blocks": 1}}),
                 id="attention-block-pooled")
    for c in BUILT if (c.kind, c.name) == ("mixer", "attention")
]


def _hybrid(case: tuple[Component, dict[str, Any]], *, seed: int) -> Any:
    """Two layers: the mixer, then softmax attention (so a recurrent mixer's state and keys share one cache)."""
    import specformer
    from fixtures.tiny import tiny_spec

    c, example = case
    spec = tiny_spec(block={"mixer": {"kind": c.name, **example}},
                     layers=[{"select": 1, "mixer": {"kind": "attention", "n_heads": 4, "n_kv_heads": 2}}])
    return specformer.build(spec, seed=seed).double().eval()


@pytest.mark.parametrize("component", MIXERS)
@torch.no_grad()
def test_every_mixer_decodes_through_the_cache_as_recompute(component: tuple[Component, dict[str, Any]]) -> None:
    _decodes_through_the_cache_as_recompute(_hybrid(component, seed=0), length=11, prompt=5, seed=0)


def _decodes_through_the_cache_as_recompute(model: Any, *, length: int, prompt: int, seed: int) -> None:
    """A prompt, then one token at a time through the generation cache: the logits of one forward over it all."""
    from fixtures.caching import cached_logits

    ids = torch.randint(0, model.vocab_size, (2, length), generator=torch.Generator().manual_seed(seed))
    torch.testing.assert_close(cached_logits(model, ids, prompt=prompt)[0], model(ids), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("component", MIXERS)
@torch.no_grad()
def test_every_mixer_gives_each_ragged_prompt_what_it_gives_alone(component: tuple[Component, dict[str, Any]]) -> None:
    from specformer_generate import generate

    model = _hybrid(component, seed=1)
    prompts = [[3, 1, 4, 1, 5, 9, 2], [6], [5, 3, 5]]
    together = generate(model, prompts, max_new_tokens=5)
    assert together == [generate(model, [p], max_new_tokens=5)[0] for p in prompts]


@pytest.mark.parametrize("component", MIXERS)
@torch.no_grad()
def test_every_mixer_beam_searches_as_recompute(component: tuple[Component, dict[str, Any]]) -> None:
    from fixtures.recurrent import beam_search_by_recompute
    from specformer_generate import generate

    model = _hybrid(component, seed=2)
    prompt = torch.randint(0, model.vocab_size, (1, 4), generator=torch.Generator().manual_seed(2))
    got = generate(model, prompt, max_new_tokens=4, num_beams=3)
    assert got[0].tolist() == beam_search_by_recompute(model, prompt, beams=3, steps=4)


@pytest.mark.parametrize("component", MIXERS)
@torch.no_grad()
def test_every_mixer_rolls_back_to_the_last_kept_draft(component: tuple[Component, dict[str, Any]]) -> None:
    """The mixer's model is its own draft's target; an unrelated draft makes most drafts fail."""
    from specformer_generate import generate

    model, draft = _hybrid(component, seed=3), _hybrid(component, seed=4)
    prompt = torch.randint(0, model.vocab_size, (2, 4), generator=torch.Generator().manual_seed(3))
    want = generate(model, prompt, max_new_tokens=9, use_cache=False)
    assert torch.equal(generate(model, prompt, max_new_tokens=9, draft=draft, draft_tokens=3), want)


# -- every residual stream: the contract, and the cache under every layout -------------------------

RESIDUALS = [c for c in BUILT if c.kind == "residual"]


@pytest.mark.parametrize("component", RESIDUALS, ids=_id)
@torch.no_grad()
def test_every_residual_stream_keeps_its_contract(component: Component) -> None:
    stream = _from_spec(component, _example(component)).double()
    assert isinstance(stream, ResidualStream)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    expanded = stream.expand(x)
    conn = stream.connection().double()
    assert isinstance(conn, ResidualConnection) and conn.n_streams == stream.n_streams
    h, mix = conn.read(expanded)
    assert h.shape == x.shape
    written = conn.write(expanded, torch.randn_like(h), mix=mix)
    assert written.shape == expanded.shape and written.dtype == expanded.dtype
    assert stream.collapse(written).shape == x.shape


def _layouts_for(c: Component) -> list[str]:
    """The layouts a model on this stream runs with (a post-norm layout needs a single stream)."""
    return [name for name in get_registry().names("layout")
            if not (name == "postnorm" and _from_spec(c, _example(c)).n_streams != 1)]


@pytest.mark.parametrize(("component", "layout"),
                         [pytest.param(c, layout, id=f"{_id(c)}-{layout}") for c in RESIDUALS for layout in _layouts_for(c)])
@torch.no_grad()
def test_every_residual_stream_decodes_through_the_cache_as_recompute(component: Component, layout: str) -> None:
    import specformer
    from fixtures.tiny import tiny_spec

    spec = tiny_spec(block={"layout": layout, "residual": {"kind": component.name, **_example(component)}})
    model = specformer.build(spec, seed=5).double().eval()
    _decodes_through_the_cache_as_recompute(model, length=9, prompt=4, seed=5)
