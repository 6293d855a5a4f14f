"""The component convention outside the layers plugin: samplers, optimizers, loggers, quantization schemes, adapters.

- Registering a plugin's components and spec sections imports no torch: checked by walking the
  module-level imports (``ast``) of its ``plugin.py``, of the modules its registration hooks
  import, and of every ``Params``/section model it registers. The walk skips the distributions'
  root packages (``specformer/__init__.py`` and ``specformer_<plugin>/__init__.py`` import torch
  today; making them lazy is the core's and the CLI start-up's work), so an import of the modules
  themselves cannot be checked by ``sys.modules`` yet.
- Every factory registered by path imports and accepts ``(params, **the sizes of its kind it names)``.
- Building through the registry and building from Python with the same params give the same thing.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import torch

import specformer
from specformer.registry.discovery import get_registry

ROOT = Path(__file__).resolve().parents[2]
SOURCES = (ROOT / "core", ROOT / "plugins")
PLUGINS = ("specformer_generate", "specformer_train", "specformer_quant", "specformer_finetune")
KINDS = ("sampler", "optimizer", "logger", "quantization", "adapter")
SECTIONS = ("generate", "train")
#: The distributions' root packages, whose own import of torch is not the components' doing (see above).
ROOTS = frozenset({"specformer", *PLUGINS})
REGISTRATION_HOOKS = ("specformer_add_kinds", "specformer_register_components")


def module_file(name: str) -> Path | None:
    for source in SOURCES:
        base = source.joinpath(*name.split("."))
        if (base / "__init__.py").is_file():
            return base / "__init__.py"
        if base.with_suffix(".py").is_file():
            return base.with_suffix(".py")
    return None


def imported_names(node: ast.AST, module: str, *, is_package: bool) -> list[str]:
    """The modules an import statement names (``from a import b`` names ``a`` and, when it is one, ``a.b``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, base] if base else package)
    return [base, *(f"{base}.{alias.name}" for alias in node.names if module_file(f"{base}.{alias.name}"))]


def top_level_imports(module: str) -> list[str]:
    """What importing ``module`` imports at once: imports outside functions and ``if TYPE_CHECKING:``."""
    path = module_file(module)
    out: list[str] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If):
                if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                    visit(node.body)
                    visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                visit(node.orelse)
                visit(node.finalbody)
            else:
                out.extend(imported_names(node, module, is_package=path.name == "__init__.py"))

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return out


def with_parents(module: str) -> list[str]:
    """``module`` and the packages Python imports before it, less the distributions' roots."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1) if ".".join(parts[:i]) not in ROOTS]


def torch_chain(start: str) -> list[str] | None:
    """The first chain of top-level project imports from ``start`` that reaches torch, or None."""
    seen: set[str] = set()

    def walk(module: str) -> list[str] | None:
        if module in seen or module_file(module) is None:
            return None
        seen.add(module)
        for name in top_level_imports(module):
            if name.split(".")[0] == "torch":
                return [module, name]
            if name.split(".")[0] in ROOTS:
                for step in with_parents(name):
                    chain = walk(step)
                    if chain:
                        return [module, *chain]
        return None

    for step in with_parents(start):
        chain = walk(step)
        if chain:
            return chain
    return None


def registration_modules(plugin: str) -> set[str]:
    """``plugin.py``, what its registration hooks import, and the modules of every model it registers."""
    module = f"{plugin}.plugin"
    tree = ast.parse(module_file(module).read_text(encoding="utf-8"))
    found = {module}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in REGISTRATION_HOOKS:
            for inner in ast.walk(node):
                found.update(name for name in imported_names(inner, module, is_package=False)
                             if name.split(".")[0] in ROOTS)
    registry = get_registry()
    for kind in KINDS:
        for name in registry.names(kind):
            component = registry.get(kind, name)
            if component.plugin == plugin.removeprefix("specformer_"):
                found.add(component.params.__module__)
    for section in SECTIONS:
        model, owner = registry.sections[section]
        if owner == plugin.removeprefix("specformer_"):
            found.add(model.__module__)
    return found


@pytest.mark.parametrize("plugin", PLUGINS)
def test_registering_a_plugins_components_and_sections_imports_no_torch(plugin: str) -> None:
    modules = registration_modules(plugin)
    assert f"{plugin}.plugin" in modules and len(modules) > 1, modules
    chains = {module: chain for module in sorted(modules) if (chain := torch_chain(module))}
    assert not chains, "\n".join(f"{module}: {' -> '.join(chain)}" for module, chain in chains.items())


def test_the_import_walk_finds_torch_behind_a_project_module() -> None:
    # The check above is only as good as the walk: a sampler module reaches torch through its own imports.
    assert torch_chain("specformer_generate.samplers.top_k") == ["specformer_generate.samplers.top_k", "torch"]
    assert torch_chain("specformer_train.optimizers.adamw")[-1].split(".")[0] == "torch"
    assert torch_chain("specformer_generate.samplers.params") is None


def ours() -> list[tuple[str, str]]:
    registry = get_registry()
    return [(kind, name) for kind in KINDS for name in registry.names(kind)
            if f"specformer_{registry.get(kind, name).plugin}" in PLUGINS]


@pytest.mark.parametrize("kind, name", ours())
def test_every_factory_is_registered_by_path_and_takes_params_and_the_sizes_it_names(kind: str, name: str) -> None:
    registry = get_registry()
    component = registry.get(kind, name)
    assert isinstance(component.factory_ref, str), f"{kind} {name!r} is registered by a callable, which imports it"
    factory = component.factory  # imports it
    signature = inspect.signature(factory)
    sizes = registry.kinds[kind].sizes
    named = [p for p in list(signature.parameters.values())[1:] if p.kind is not inspect.Parameter.VAR_KEYWORD]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY and p.name in sizes for p in named), (signature, sizes)
    assert "__doc__" in vars(component.params) and component.summary, f"{kind} {name!r} has no description"
    assert getattr(factory, "Params", component.params) is component.params


SAMPLER_PARAMS = {"temperature": {"value": 0.7}, "top_k": {"k": 3}, "top_p": {"p": 0.9}, "min_p": {"p": 0.1},
                  "typical": {"p": 0.5}, "repetition_penalty": {"penalty": 1.3}, "frequency_penalty": {"penalty": 0.5},
                  "presence_penalty": {"penalty": 0.5}, "no_repeat_ngram": {"n": 2}, "greedy": {}}


@pytest.mark.parametrize("name", sorted(SAMPLER_PARAMS))
def test_a_sampler_from_a_spec_is_the_sampler_from_python(name: str) -> None:
    component = get_registry().get("sampler", name)
    params = component.params(**SAMPLER_PARAMS[name])
    from_spec = get_registry().resolve("sampler", {"kind": name, **SAMPLER_PARAMS[name]}).make()
    from_python = component.factory(params)
    assert type(from_spec) is type(from_python) and repr(from_spec) == repr(from_python)
    logits, ids = torch.randn(2, 11, generator=torch.Generator().manual_seed(0)), torch.tensor([[1, 2, 1], [3, 3, 4]])
    assert torch.equal(from_spec(logits, ids), from_python(logits, ids))
    # What the generate section checks without building a sampler agrees with the built one.
    assert params.CHOOSES_TOKEN == callable(getattr(from_python, "choose", None))


def test_every_registered_sampler_is_covered_here() -> None:
    assert set(get_registry().names("sampler")) >= set(SAMPLER_PARAMS)
    assert {name for kind, name in ours() if kind == "sampler"} == set(SAMPLER_PARAMS)


@pytest.mark.parametrize("name", ["adamw", "muon", "lion", "sgd"])
def test_an_optimizer_from_a_spec_is_the_optimizer_from_python(name: str, tiny_spec: dict) -> None:
    registry = get_registry()
    sizes = dict(lr=3e-3, min_lr=1e-4, weight_decay=0.05, betas=(0.8, 0.9), eps=1e-7, device=torch.device("cpu"))
    spec = {"kind": name, "groups": [{"match": ["vector"], "lr_scale": 0.5}]}
    model = specformer.build(tiny_spec, seed=0)
    from_spec = registry.resolve("optimizer", spec).make(model=model, **sizes)
    component = registry.get("optimizer", name)
    factory = component.factory
    accepted = inspect.signature(factory).parameters
    from_python = factory(component.params(**{k: v for k, v in spec.items() if k != "kind"}), model=model,
                          **{k: v for k, v in sizes.items() if k in accepted})
    assert type(from_spec) is type(from_python)

    def settings(optimizer: torch.optim.Optimizer) -> list[dict]:
        return [{k: v for k, v in group.items() if k != "params"} | {"params": [id(p) for p in group["params"]]}
                for group in optimizer.param_groups]

    assert settings(from_spec) == settings(from_python)
    # The run's settings reach the groups: the vector rule halves the run's lr, min_lr follows the peak.
    vectors = next(group for group in from_spec.param_groups if group["role"] == "vector")
    assert (vectors["peak_lr"], vectors["min_lr"]) == (pytest.approx(1.5e-3), pytest.approx(0.5e-4))


@pytest.mark.parametrize("name, params", [("int8", {"dynamic_activations": True}), ("int4", {"group_size": 64}),
                                          ("bf16", {}), ])
def test_a_quantization_scheme_from_a_spec_is_the_scheme_from_python(name: str, params: dict) -> None:
    component = get_registry().get("quantization", name)
    from_spec = get_registry().resolve("quantization", {"kind": name, **params}).make()
    from_python = component.factory(component.params(**params))
    assert type(from_spec) is type(from_python) and from_spec.name == name
    assert from_spec.params == from_python.params == component.params(**params)
    weight = torch.randn(8, 128, generator=torch.Generator().manual_seed(0))
    assert torch.equal(from_spec.quantize(weight).dequantize(), from_python.quantize(weight).dequantize())


def test_an_adapter_from_a_spec_is_the_adapter_from_python() -> None:
    component = get_registry().get("adapter", "lora")
    params = {"rank": 3, "alpha": 6.0, "dropout": 0.25, "init": "gaussian"}
    from_spec = get_registry().resolve("adapter", {"kind": "lora", **params}).make()
    from_python = component.factory(component.params(**params))
    layers = []
    for adapter in (from_spec, from_python):
        torch.manual_seed(0)
        layers.append(adapter.wrap(torch.nn.Linear(12, 7)))
    assert type(layers[0]) is type(layers[1]) and layers[0].extra_repr() == layers[1].extra_repr() == "rank=3, scaling=2"
    assert [(n, p.shape) for n, p in layers[0].named_parameters()] == [(n, p.shape) for n, p in layers[1].named_parameters()]
    assert all(torch.equal(a, b) for a, b in zip(layers[0].state_dict().values(), layers[1].state_dict().values()))
    assert layers[0].dropout.p == 0.25


def test_the_loggers_take_the_run_settings_they_name(tmp_path: Path) -> None:
    registry = get_registry()
    sizes = dict(out_dir=tmp_path, resume_step=None, plot=False, tensorboard=False)
    jsonl = registry.resolve("logger", {"kind": "jsonl"}).make(**sizes)
    assert jsonl.plot is False and jsonl.out_dir == tmp_path
    jsonl.close("finished")
    assert registry.resolve("logger", {"kind": "tensorboard"}).make(**sizes) is None  # train.tensorboard: false
