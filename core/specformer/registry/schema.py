"""The JSON Schema of a whole spec, with every registered component's params.

Editors (VS Code's YAML extension, for one) use it for completion and validation:
each component field becomes a ``oneOf`` over the registered components of its kind,
told apart by ``kind``.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from pydantic import BaseModel

from specformer.messages import plain_text
from specformer.registry.params import COMPONENT_MARKER, component_schema_ref
from specformer.registry.components import Registry
from specformer.spec.shapes import Spec

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"

# Spec fields that hold a component, and of which kind.
_COMPONENT_FIELDS = {
    ("ModelSpec", "positional"): "positional",
    ("ModelSpec", "final_norm"): "norm",
    ("ModelSpec", "embedding_norm"): "norm",
    ("ModelSpec", "per_layer_input"): "per_layer_input",
    ("BlockSpec", "layout"): "layout",
    ("BlockSpec", "norm"): "norm",
    ("BlockSpec", "mixer"): "mixer",
    ("BlockSpec", "ffn"): "ffn",
    ("BlockSpec", "positional"): "positional",
    ("BlockSpec", "residual"): "residual",
    ("SharedBlockSpec", "layout"): "layout",
    ("SharedBlockSpec", "norm"): "norm",
    ("SharedBlockSpec", "mixer"): "mixer",
    ("SharedBlockSpec", "ffn"): "ffn",
}


def spec_json_schema(registry: Registry) -> dict[str, Any]:
    schema = Spec.model_json_schema(ref_template="#/$defs/{model}")
    defs: dict[str, Any] = schema.setdefault("$defs", {})
    for (model_name, field_name), kind in _COMPONENT_FIELDS.items():
        prop = defs[model_name]["properties"][field_name]
        description = prop.get("description")
        new: dict[str, Any] = component_schema_ref(kind)
        if "anyOf" in prop:  # optional
            new = {"anyOf": [new, {"type": "null"}]}
        if description:
            new["description"] = description
        defs[model_name]["properties"][field_name] = new
    for kind in registry.kinds:
        defs[f"{kind}-component"] = {
            "oneOf": [_component_schema(c.name, c.params, plain_text(c.summary), defs) for c in registry if c.kind == kind]
            + [{"type": "string", "enum": registry.names(kind), "description": "A component by name, with default params."}],
            "description": registry.kinds[kind].doc,
        }
    schema["properties"]["model"] = {"$ref": "#/$defs/ModelSpec"}
    schema["additionalProperties"] = False
    for name, (model, _plugin) in sorted(registry.sections.items()):
        schema["properties"][name] = _inline(model, defs)
    schema["$schema"] = SCHEMA_DIALECT
    schema["title"] = "specformer spec"
    return schema


def _inline(model: type[BaseModel], defs: dict[str, Any]) -> dict[str, Any]:
    sub = _swap_markers(copy.deepcopy(model.model_json_schema(ref_template="#/$defs/{model}")))
    for name, value in sub.pop("$defs", {}).items():
        defs.setdefault(name, value)
    return sub


def _component_schema(name: str, params: type[BaseModel], doc: str, defs: dict[str, Any]) -> dict[str, Any]:
    sub = _inline(params, defs)
    sub["properties"] = {"kind": {"const": name, "description": doc}, **sub.get("properties", {})}
    sub["required"] = ["kind", *sub.get("required", [])]
    sub["title"] = name
    sub["additionalProperties"] = False
    return sub


def _swap_markers(node: Any) -> Any:
    """Replace each sub-component placeholder with a reference to its kind's union."""
    if isinstance(node, dict):
        if COMPONENT_MARKER in node:
            return component_schema_ref(node[COMPONENT_MARKER])
        return {k: _swap_markers(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_swap_markers(v) for v in node]
    return node


# -- a param's type as plain text (``specformer components``) ---------------------------

_SCALARS = {"integer": "int", "number": "float", "string": "str", "boolean": "bool", "null": "null"}
_BOUNDS = (("exclusiveMinimum", ">"), ("minimum", "≥"), ("exclusiveMaximum", "<"), ("maximum", "≤"),
           ("minLength", "length ≥"), ("maxLength", "length ≤"), ("minItems", "items ≥"), ("maxItems", "items ≤"))


def param_types(params: type[BaseModel]) -> dict[str, str]:
    """Each field of a Params model and its type with bounds, from its JSON schema: ``float > 0``.

    The same schema the docs catalogue and ``specformer schema`` are made from, so the
    three agree: ``int ≥ 1``, ``float ≥ 0, < 1 or null``, ``one of "a", "b"``,
    ``list of sampler component``.
    """
    schema = params.model_json_schema(ref_template="#/$defs/{model}")
    defs = schema.get("$defs", {})
    props = schema.get("properties", {})
    return {name: describe_type(props.get(info.alias or name, {}), defs) for name, info in params.model_fields.items()}


def describe_type(node: dict[str, Any], defs: dict[str, Any] | None = None) -> str:
    """A JSON-schema node as a short plain-text type with its bounds."""
    defs = defs or {}
    if COMPONENT_MARKER in node:
        return f"{node[COMPONENT_MARKER]} component"
    ref = node.get("$ref")
    if ref:
        target = defs.get(ref.rsplit("/", 1)[-1])
        return describe_type(target, defs) if target is not None else ref.rsplit("/", 1)[-1]
    options = node.get("anyOf") or node.get("oneOf")
    if options:
        return " or ".join(dict.fromkeys(describe_type(option, defs) for option in options))
    if "enum" in node:
        return "one of " + ", ".join(json.dumps(v) for v in node["enum"])
    if "const" in node:
        return json.dumps(node["const"])
    kind = node.get("type")
    if isinstance(kind, list):
        return " or ".join(_SCALARS.get(k, k) for k in kind)
    if kind == "array":
        items = node.get("items") or node.get("prefixItems")
        if isinstance(items, list):  # a tuple: (float, float)
            text = "(" + ", ".join(describe_type(i, defs) for i in items) + ")"
        else:
            text = "list of " + (describe_type(items, defs) if items else "any")
    elif kind == "object":
        extra = node.get("additionalProperties")
        text = f"mapping of str to {describe_type(extra, defs)}" if isinstance(extra, dict) and extra else "mapping"
    else:
        text = _SCALARS.get(kind, "any")
    bounds = [f"{sign} {json.dumps(node[key])}" for key, sign in _BOUNDS if key in node]
    return text + (" " + ", ".join(bounds) if bounds else "")
