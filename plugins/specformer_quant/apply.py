"""Quantizing a model in place, and the recipe that says how (stored in a quantized checkpoint's header).

Every ``nn.Linear`` becomes a :class:`~specformer_quant.weights.QuantizedLinear` and every
3-d weight (an MoE layer's stacked experts) a quantized stack, except what stays in
higher precision: embeddings always (a lookup reads one row, not the whole table), MoE
routers (their argmax picks the experts) and anything tied to an embedding.

The LM head: an untied head (its own ``lm_head`` linear) is quantized by default: decoding
reads all of it every token, and left in float32 it cost more per token than all the
int8 layers of a 30M model together (issue 51). ``quantize_lm_head=False`` keeps it float.
The recipe lists it under ``"linears"`` when it was quantized, so a checkpoint quantized
before this default (head absent from the list) loads with its float head as it was.

A tied LM head (the model multiplies by its embedding table; ``model.lm_head`` is None)
stays float unless ``quantize_lm_head=True``, since quantizing it adds a separate copy
(bytes on disk the untied case does not add): the model gets a quantized
``lm_head`` made from the embedding, the embedding stays float for its lookups, and the
recipe says ``"tied_head": true``. Decoding reads the whole head every token but one
embedding row, so this is where a tied model's bytes per token go (a third of the 40M
Llama of ``benchmarks/bench_generate.py``).

``lm_head_scheme`` quantizes the LM head (tied copy or not) with another scheme than the
layers, e.g. int4 layers with an int8 head: the recipe then says ``"lm_head_scheme"``.
"""

from __future__ import annotations

import json
from typing import Any

import torch
from torch import nn

from specformer.registry.params import as_component_ref, resolve_component
from specformer_quant.weights import QuantizedLinear, QuantizedWeight

#: The header entry of a quantized checkpoint.
RECIPE_KEY = "quantization"
#: Linear layers never quantized: routing decisions stay in float.
KEPT_LINEARS = ("router", "shared_gate")


def scheme_from(ref: Any, *, path: str = "quantization") -> Any:
    """The scheme object for ``"int8"`` or ``{"kind": "int4", "group_size": 64}``; SpecError naming each bad field."""
    return resolve_component("quantization", ref, path=path).make()


def quantize(model: nn.Module, scheme: Any, *, quantize_lm_head: bool | None = None,
             lm_head_scheme: Any = None) -> dict[str, Any]:
    """Quantize ``model``'s weights in place with ``scheme`` (a name, a mapping or a resolved scheme); the recipe.

    ``quantize_lm_head``: None (default) quantizes an untied head and keeps a tied one float; True quantizes
    either (a tied one as a copy); False keeps the head float. ``lm_head_scheme``: the LM head's own scheme
    instead of ``scheme`` (implies ``quantize_lm_head=True`` when it is None).
    """
    if quantize_lm_head is not None and not isinstance(quantize_lm_head, bool):
        raise ValueError(f"quantize_lm_head must be True, False or None (the default: an untied head quantized, a "
                         f"tied one kept float), got {quantize_lm_head!r}")
    scheme_obj, ref = _scheme_and_ref(scheme, path="quantization")
    recipe: dict[str, Any] = {"scheme": ref, "linears": [], "stacks": []}
    head_obj = scheme_obj
    if lm_head_scheme is not None:
        if quantize_lm_head is False:
            raise ValueError("lm_head_scheme is the LM head's own scheme; it cannot go with quantize_lm_head=False")
        quantize_lm_head = True
        head_obj, recipe["lm_head_scheme"] = _scheme_and_ref(lm_head_scheme, path="lm_head_scheme")
    tied = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Linear):
            leaf = name.rsplit(".", 1)[-1]
            if leaf in KEPT_LINEARS or id(module.weight) in tied or (name == "lm_head" and quantize_lm_head is False):
                continue
            chosen = head_obj if name == "lm_head" else scheme_obj
            _replace(model, name, QuantizedLinear(weight=chosen.quantize(module.weight), bias=module.bias))
            recipe["linears"].append(name)
        else:
            for pname, param in list(module.named_parameters(recurse=False)):
                if param.dim() == 3:  # stacked expert weights (E, N, K)
                    del module._parameters[pname]
                    setattr(module, pname, scheme_obj.quantize(param))
                    recipe["stacks"].append(f"{name}.{pname}" if name else pname)
    if quantize_lm_head is True and _has_tied_head(model):
        model.lm_head = QuantizedLinear(weight=head_obj.quantize(model.embedding.weight), bias=None)
        recipe["tied_head"] = True
    model.quantization = recipe  # type: ignore[attr-defined]
    return recipe


def rebuild(model: nn.Module, recipe: dict[str, Any]) -> None:
    """Give a float model the quantized modules a recipe lists (empty, to load stored buffers into)."""
    scheme, head_scheme = schemes_of(recipe)
    for name in recipe.get("linears", []):
        linear = model.get_submodule(name)
        if not isinstance(linear, nn.Linear):
            raise ValueError(f"the recipe quantizes {name!r}, which is not a linear layer of this model")
        chosen = head_scheme if name == "lm_head" else scheme
        _replace(model, name, QuantizedLinear(weight=chosen.empty(tuple(linear.weight.shape)), bias=linear.bias))
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
        model.lm_head = QuantizedLinear(weight=head_scheme.empty(tuple(model.embedding.weight.shape)), bias=None)
    model.quantization = recipe  # type: ignore[attr-defined]


def schemes_of(recipe: dict[str, Any]) -> tuple[Any, Any]:
    """The scheme objects of a recipe: the layers', and the LM head's (its own ``lm_head_scheme``, or the same)."""
    scheme = scheme_from(recipe.get("scheme"), path="quantization.scheme")
    if recipe.get("lm_head_scheme") is None:
        return scheme, scheme
    return scheme, scheme_from(recipe["lm_head_scheme"], path="quantization.lm_head_scheme")


def _scheme_and_ref(scheme: Any, *, path: str) -> tuple[Any, Any]:
    """A scheme given as a name, a mapping or a resolved object: the object, and the reference a recipe stores."""
    if isinstance(scheme, (str, dict)):
        return scheme_from(scheme, path=path), as_component_ref(scheme)
    return scheme, {"kind": scheme.name, **scheme.params.model_dump()}


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


__all__ = ["QuantizedWeight", "RECIPE_KEY", "quantize", "rebuild", "recipe_json", "scheme_from", "schemes_of",
           "weight_bytes"]
