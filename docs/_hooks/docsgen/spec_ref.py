"""The field-by-field spec reference, from the pydantic models and every registered section."""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel
from specformer.registry.components import Registry
from specformer.registry.schema import spec_json_schema
from specformer.spec import BlockSpec, LayerOverride, ModelSpec, Spec

from docsgen.fields import fields_table
from docsgen.text import rst_to_md

# Fields whose models carry no description of their own.
_LAYER_FIELD_HELP = {
    "layout": "Replaces or changes the block's `layout` on the selected layers.",
    "norm": "Replaces or changes the block's `norm` on the selected layers.",
    "mixer": "Replaces or changes the block's `mixer` on the selected layers.",
    "ffn": "Replaces or changes the block's `ffn` on the selected layers.",
}


def _models_in(annotation: Any, out: dict[str, type[BaseModel]]) -> None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if annotation.__name__ not in out:
            out[annotation.__name__] = annotation
            for info in annotation.model_fields.values():
                _models_in(info.annotation, out)
        return
    for arg in typing.get_args(annotation):
        _models_in(arg, out)


def _anchor(path: str) -> str:
    return path.replace(".", "-").replace("[]", "").lower()


def spec_reference_page(registry: Registry, *, catalogue_kinds: set[str]) -> str:
    schema = spec_json_schema(registry)
    defs = schema.get("$defs", {})
    classes: dict[str, type[BaseModel]] = {}
    _models_in(Spec, classes)
    for model, _plugin in registry.sections.values():
        _models_in(model, classes)

    # Where each model sits in a spec: model, model.block, model.layers[], train, train.optimizer ...
    sections: list[tuple[str, type[BaseModel] | None, dict[str, Any]]] = []
    where: dict[str, str] = {}
    roots: list[tuple[str, str | None, type[BaseModel] | None, dict[str, Any]]] = [("model", "ModelSpec", ModelSpec, defs["ModelSpec"])]
    for name, (model, _plugin) in sorted(registry.sections.items()):
        roots.append((name, model.__name__, model, schema["properties"][name]))
    for root in roots:  # each section followed by the models nested in it
        queue = [root]
        while queue:
            path, def_name, model, node = queue.pop(0)
            if def_name in where:
                continue
            if def_name:
                where[def_name] = path
            sections.append((path, model, node))
            for prop, sub in (node.get("properties") or {}).items():
                for ref, suffix in _refs(sub):
                    child = ref.rsplit("/", 1)[-1]
                    if child.endswith("-component") or child in where or child not in defs:
                        continue
                    queue.append((f"{path}.{prop}{suffix}", child, classes.get(child), defs[child]))

    def link_kind(kind: str) -> str:
        if kind in catalogue_kinds:
            return f"a [{kind}](../catalogue/{kind}.md) component"
        return f"a {kind} component"

    def link_def(name: str) -> str:
        if name in where:
            return f"[`{where[name]}`](#{_anchor(where[name])})"
        return f"`{name}`"

    lines = [
        "# Spec reference",
        "",
        "Every field a spec file can hold, generated from the pydantic models that validate it. "
        "Top-level sections other than `model` come from plugins; the ones registered when this site "
        "was built are listed here. Component fields (`positional`, `norm`, `mixer`, ...) take a "
        "registered component: its params are in the [component catalogue](../catalogue/index.md).",
        "",
        "## The file",
        "",
        "| Section | Registered by | What it holds |",
        "| --- | --- | --- |",
        f"| [`model`](#model) | core | {rst_to_md(ModelSpec.__doc__ or '')} |",
    ]
    for name, (model, plugin) in sorted(registry.sections.items()):
        summary = rst_to_md((model.__doc__ or "").strip().splitlines()[0] if model.__doc__ else "")
        lines.append(f"| [`{name}`](#{_anchor(name)}) | plugin `{plugin}` | {summary} |")
    lines.append("")
    for path, model, node in sections:
        title = model.__name__ if model is not None else ""
        lines += [f"## {path} {{ #{_anchor(path)} }}", ""]
        if title:
            lines += [f"<p class=\"sf-meta\">model <code>{title}</code></p>", ""]
        doc = (model.__doc__ if model is not None else node.get("description")) or ""
        lines += [rst_to_md(doc), ""]
        if model is not None:
            describe = (lambda name: _LAYER_FIELD_HELP.get(name, "")) if model is LayerOverride else None
            lines.append(fields_table(model, node, link_kind=link_kind, link_def=link_def, describe=describe, header="Field"))
        if model is BlockSpec:
            lines += [
                "Each of these fields takes a component by name (`norm: rmsnorm`) or as a mapping "
                "with `kind` and its params (`norm: {kind: rmsnorm, eps: 1.0e-5}`).",
                "",
            ]
    return "\n".join(lines)


def _refs(node: dict[str, Any]) -> list[tuple[str, str]]:
    """``$ref`` targets in a property's schema, with ``[]`` when inside an array."""
    out: list[tuple[str, str]] = []
    if "$ref" in node:
        out.append((node["$ref"], ""))
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in node.get(key, []):
            out += _refs(sub)
    if isinstance(node.get("items"), dict):
        out += [(ref, "[]" + suffix) for ref, suffix in _refs(node["items"])]
    if isinstance(node.get("additionalProperties"), dict):
        out += [(ref, ".*" + suffix) for ref, suffix in _refs(node["additionalProperties"])]
    return out
