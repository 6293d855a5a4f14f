"""Components outside the layers plugin (samplers, optimizers, loggers, quantization schemes, adapters):
building through the registry and building from Python with the same params give the same thing.

The structure every component shares (registered by path, the factory's signature, torch-free
Params) is checked for all plugins in ``tests/core/test_component_contract.py``; that registering
imports no torch, by ``sys.modules``, in ``tests/core/test_startup.py``.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

import specformer
from specformer.registry.discovery import get_registry

PLUGINS = ("specformer_generate", "specformer_train", "specformer_quant", "specformer_finetune")
KINDS = ("sampler", "optimizer", "logger", "quantization", "adapter")


def ours() -> list[tuple[str, str]]:
    registry = get_registry()
    return [(kind, name) for kind in KINDS for name in registry.names(kind)
            if f"specformer_{registry.get(kind, name).plugin}" in PLUGINS]


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


#: The constraint samplers run only once generate() binds them to a tokenizer and a prompt (Sampler.for_run), so
#: built both ways they are compared by what they are, not by a step on logits alone (tests/plugins/generate/
#: test_gen_structured.py runs them).
CONSTRAINT_PARAMS = {"regex": {"pattern": "[ab]+"}, "choice": {"options": ["yes", "no"]},
                     "json_schema": {"schema": {"type": "object"}}, "grammar": {"lark": 'start: "a"+'}}


@pytest.mark.parametrize("name", sorted(CONSTRAINT_PARAMS))
def test_a_constraint_from_a_spec_is_the_constraint_from_python(name: str) -> None:
    component = get_registry().get("sampler", name)
    params = component.params(**CONSTRAINT_PARAMS[name])
    from_spec = get_registry().resolve("sampler", {"kind": name, **CONSTRAINT_PARAMS[name]}).make()
    from_python = component.factory(params)
    assert type(from_spec) is type(from_python) and repr(from_spec) == repr(from_python)
    assert from_spec.grammar == from_python.grammar
    assert params.CHOOSES_TOKEN == callable(getattr(from_python, "choose", None))


def test_every_registered_sampler_is_covered_here() -> None:
    covered = set(SAMPLER_PARAMS) | set(CONSTRAINT_PARAMS)
    assert set(get_registry().names("sampler")) >= covered
    assert {name for kind, name in ours() if kind == "sampler"} == covered


@pytest.mark.parametrize("name", ["adamw", "muon", "lion", "sgd"])
def test_an_optimizer_from_a_spec_is_the_optimizer_from_python(name: str, fresh_tiny_spec: dict) -> None:
    registry = get_registry()
    sizes = dict(lr=3e-3, min_lr=1e-4, weight_decay=0.05, betas=(0.8, 0.9), eps=1e-7, device=torch.device("cpu"))
    spec = {"kind": name, "groups": [{"match": ["vector"], "lr_scale": 0.5}]}
    model = specformer.build(fresh_tiny_spec, seed=0)
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
