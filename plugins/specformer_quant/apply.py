"""Quantizing a model in place, and the recipe that says how (stored in a quantized checkpoint's header).

Every ``nn.Linear`` becomes a :class:`~specformer_quant.weights.QuantizedLinear` and every
3-d weight (an MoE layer's stacked experts) a quantized stack, except what stays in
higher precision: embeddings always (a lookup reads one row, not the whole table), the
LM head unless ``quantize_lm_head``, MoE routers (their argmax picks the experts) and
anything tied to an embedding.

A tied LM head (the model multiplies by its embedding table; ``model.lm_head`` is None)
is quantized with ``quantize_lm_head`` as a separate copy: the model gets a quantized
``lm_head`` made from the embedding, the embedding stays float for its lookups, and the
recipe says ``"tied_head": true``. Decoding reads the whole head every token but one
embedding row, so this is where a tied model's bytes per token go (a third of the 40M
Llama of ``benchmarks/bench_generate.py``).
"""

from __future__ import annotations

import json
from typing import Any

import torch
from torch import nn

from specformer.errors import Problem, SpecError, UnknownComponentError
from specformer.params import as_component_ref
from specformer.plugins import get_registry
from specformer_quant.weights import QuantizedLinear, QuantizedWeight

#: The header entry of a quantized checkpoint.
RECIPE_KEY = "quantization"
#: Linear layers never quantized: routing decisions stay in float.
KEPT_LINEARS = ("router", "shared_gate")


def scheme_from(ref: Any, *, path: str = "quantization") -> Any:
    """The scheme object for ``"int8"`` or ``{"kind": "int4", "group_size": 64}``; SpecError naming what is wrong."""
    registry = get_registry()
    try:
        return registry.resolve("quantization", as_component_ref(ref)).make()
    except UnknownComponentError as exc:
        raise SpecError([Problem(f"{path}.kind", str(exc))]) from None
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise SpecError([Problem(path, str(exc))]) from None


def quantize(model: nn.Module, scheme: Any, *, quantize_lm_head: bool = False) -> dict[str, Any]:
    """Quantize ``model``'s weights in place with ``scheme`` (a name, a mapping or a resolved scheme); the recipe."""
    scheme_obj = scheme_from(scheme) if isinstance(scheme, (str, dict)) else scheme
    ref = as_component_ref(scheme) if isinstance(scheme, (str, dict)) else None
    recipe = {"scheme": ref or {"kind": scheme_obj.name, **scheme_obj.params.model_dump()},
              "linears": [], "stacks": []}
    tied = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Linear):
            leaf = name.rsplit(".", 1)[-1]
            if leaf in KEPT_LINEARS or id(module.weight) in tied or (name == "lm_head" and not quantize_lm_head):
                continue
            _replace(model, name, QuantizedLinear(weight=scheme_obj.quantize(module.weight), bias=module.bias))
            recipe["linears"].append(name)
        else:
            for pname, param in list(module.named_parameters(recurse=False)):
                if param.dim() == 3:  # stacked expert weights (E, N, K)
                    del module._parameters[pname]
                    setattr(module, pname, scheme_obj.quantize(param))
                    recipe["stacks"].append(f"{name}.{pname}" if name else pname)
    if quantize_lm_head and _has_tied_head(model):
        model.lm_head = QuantizedLinear(weight=scheme_obj.quantize(model.embedding.weight), bias=None)
        recipe["tied_head"] = True
    model.quantization = recipe  # type: ignore[attr-defined]
    return recipe


def rebuild(model: nn.Module, recipe: dict[str, Any]) -> None:
    """Give a float model the quantized modules a recipe lists (empty, to load stored buffers into)."""
    scheme = scheme_from(recipe.get("scheme"), path="quantization.scheme")
    for name in recipe.get("linears", []):
        linear = model.get_submodule(name)
        if not isinstance(linear, nn.Linear):
            raise ValueError(f"the recipe quantizes {name!r}, which is not a linear layer of this model")
        _replace(model, name, QuantizedLinear(weight=scheme.empty(tuple(linear.weight.shape)), bias=linear.bias))
    for name in recipe.get("stacks", []):
        owner, _, pname = name.rpartition(".")
        module = model.get_submodule(owner)
        param = module._parameters.get(pname)
        if param is None or param.dim() != 3:
            raise ValueError(f"the recipe quantizes {name!r}, which is not a stacked expert weight of this model")
        del module._parameters[pname]
        setattr(module, pname, scheme.empty(tuple(param.shape)))
    if recipe.get("tied_head"):
        if not _has_tied_head(model):
            raise ValueError("the recipe quantizes a copy of the tied LM head, but this model's head is not tied")
        model.lm_head = QuantizedLinear(weight=scheme.empty(tuple(model.embedding.weight.shape)), bias=None)
    model.quantization = recipe  # type: ignore[attr-defined]


def weight_bytes(model: nn.Module) -> int:
    """Bytes of every parameter and buffer (quantized weights at their stored size)."""
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _has_tied_head(model: nn.Module) -> bool:
    """A decoder whose logits come from its embedding table (``lm_head`` is None)."""
    return getattr(model, "lm_head", False) is None and isinstance(getattr(model, "embedding", None), nn.Embedding)


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    owner, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(owner) if owner else model, leaf, new)


def recipe_json(recipe: dict[str, Any]) -> str:
    return json.dumps(recipe, sort_keys=True)


__all__ = ["QuantizedWeight", "RECIPE_KEY", "quantize", "rebuild", "recipe_json", "scheme_from", "weight_bytes"]
