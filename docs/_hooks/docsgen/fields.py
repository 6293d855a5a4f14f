"""Tables of fields (name, type, default, description) from pydantic models and their JSON schema."""

from __future__ import annotations

import json
from typing import Any, Callable

from pydantic import BaseModel
from specformer.registry.params import COMPONENT_MARKER

from docsgen.text import cell, rst_to_md

LinkKind = Callable[[str], str]
LinkDef = Callable[[str], str]

_SCALARS = {"integer": "int", "number": "float", "string": "str", "boolean": "bool", "null": "null"}


def type_md(node: dict[str, Any], *, link_kind: LinkKind, link_def: LinkDef) -> str:
    """A JSON-schema node as a short Markdown type: ``int > 0 or null``, ``one of `a`, `b` ``."""
    if COMPONENT_MARKER in node:
        return link_kind(node[COMPONENT_MARKER])
    ref = node.get("$ref")
    if ref:
        name = ref.rsplit("/", 1)[-1]
        if name.endswith("-component"):
            return link_kind(name[: -len("-component")])
        return link_def(name)
    if "anyOf" in node or "oneOf" in node:
        options = [type_md(n, link_kind=link_kind, link_def=link_def) for n in node.get("anyOf") or node["oneOf"]]
        return " or ".join(dict.fromkeys(options))
    if "enum" in node:
        return "one of " + ", ".join(f"`{json.dumps(v)}`" if not isinstance(v, str) else f"`{v}`" for v in node["enum"])
    if "const" in node:
        return f"`{node['const']}`"
    kind = node.get("type")
    if isinstance(kind, list):
        return " or ".join(_SCALARS.get(k, k) for k in kind)
    if kind == "array":
        items = node.get("items")
        inner = type_md(items, link_kind=link_kind, link_def=link_def) if items else "any"
        return f"list of {inner}"
    if kind == "object":
        extra = node.get("additionalProperties")
        if isinstance(extra, dict) and extra:
            return f"mapping of str to {type_md(extra, link_kind=link_kind, link_def=link_def)}"
        return "mapping"
    base = f"`{_SCALARS[kind]}`" if kind in _SCALARS else "any"
    return base + _bounds(node)


def _bounds(node: dict[str, Any]) -> str:
    parts = []
    for key, sign in (("exclusiveMinimum", ">"), ("minimum", "≥"), ("exclusiveMaximum", "<"), ("maximum", "≤")):
        if key in node:
            parts.append(f"{sign} {node[key]}")
    return (" " + ", ".join(parts)) if parts else ""


def default_md(model: type[BaseModel], name: str) -> str:
    info = model.model_fields[name]
    if info.is_required():
        return "**required**"
    value = info.get_default(call_default_factory=True)
    return f"`{json.dumps(jsonable(value))}`"


def jsonable(value: Any) -> Any:
    """A default as it would be written in a spec (components as ``{kind: ...}``)."""
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def fields_table(
    model: type[BaseModel],
    schema: dict[str, Any],
    *,
    link_kind: LinkKind,
    link_def: LinkDef,
    describe: Callable[[str], str] | None = None,
    header: str = "Param",
) -> str:
    """One row per field of ``model``; ``schema`` is the model's JSON schema (its ``properties``)."""
    props = schema.get("properties", {})
    if not model.model_fields:
        return "_No params._ Write it by name alone.\n"
    rows = [f"| {header} | Type | Default | Description |", "| --- | --- | --- | --- |"]
    for name, info in model.model_fields.items():
        node = props.get(info.alias or name, {})
        description = info.description or (describe(name) if describe else "") or _model_summary(info.annotation)
        rows.append(
            "| "
            + " | ".join(
                [
                    f"`{info.alias or name}`",
                    cell(type_md(node, link_kind=link_kind, link_def=link_def)),
                    cell(default_md(model, name)),
                    cell(rst_to_md(description)),
                ]
            )
            + " |"
        )
    return "\n".join(rows) + "\n"


def _model_summary(annotation: Any) -> str:
    """A field typed by a model and left undescribed reads as that model's summary line."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel) and annotation.__doc__:
        return annotation.__doc__.strip().splitlines()[0]
    return ""
