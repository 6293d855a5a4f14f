"""The registry as plain text for a terminal: what ``specformer components`` prints.

Per kind, a heading with the count; per component, its name, plugin and summary line
(docstring markup removed); per param, its type and bounds (from the same JSON schema
the docs catalogue uses), its default or ``required``, and its description::

    norm (3 components)
      rmsnorm    [layers] Divide by the root mean square of the channels, then scale: x / sqrt(...) ...
          eps     float > 0  default 1e-06  Added to the mean square for stability.
          offset  float      default 0.0    Scale by (offset + weight) ...
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from specformer.messages import plain_text, plural
from specformer.registry.components import Component
from specformer.registry.schema import param_types


def format_components(components: Iterable[Component]) -> str:
    """The listing of ``components``, grouped by kind (kinds and names sorted)."""
    chosen = list(components)
    lines: list[str] = []
    for kind in sorted({c.kind for c in chosen}):
        of_kind = sorted((c for c in chosen if c.kind == kind), key=lambda c: c.name)
        if lines:
            lines.append("")
        lines.append(f"{kind} ({plural(len(of_kind), 'component')})")
        name_width = max(len(c.name) for c in of_kind)
        plugin_width = max(len(c.plugin) for c in of_kind) + 2
        for c in of_kind:
            lines.append(f"  {c.name:<{name_width}}  {'[' + c.plugin + ']':<{plugin_width}} {plain_text(c.summary)}".rstrip())
            lines += _param_lines(c)
    return "\n".join(lines)


def _param_lines(component: Component) -> list[str]:
    types = param_types(component.params)
    rows = []
    for name, info in component.params.model_fields.items():
        default = "required" if info.is_required() else f"default {json.dumps(jsonable_default(component, name))}"
        rows.append((info.alias or name, types[name], default, plain_text(info.description or "")))
    if not rows:
        return []
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return [
        f"      {a:<{widths[0]}}  {b:<{widths[1]}}  {c:<{widths[2]}}  {d}".rstrip()
        for a, b, c, d in rows
    ]


def jsonable_default(component: Component, name: str) -> Any:
    """A param's default as a spec would write it (a sub-component as ``{kind: ...}``); ``...`` if required."""
    value = component.defaults()[name]
    if value is ...:
        return value
    try:
        json.dumps(value)
        return value
    except TypeError:
        return value.to_dict() if hasattr(value, "to_dict") else str(value)


def components_json(components: Iterable[Component]) -> list[dict[str, Any]]:
    """The listing as JSON: each component with its plugin, plain-text summary and per-param default and type."""
    out = []
    for c in components:
        types = param_types(c.params)
        defaults = {k: (None if jsonable_default(c, k) is ... else jsonable_default(c, k)) for k in c.params.model_fields}
        out.append({
            "kind": c.kind,
            "name": c.name,
            "plugin": c.plugin,
            "doc": plain_text(c.summary),
            "params": defaults,
            "types": types,
            "required": [k for k, info in c.params.model_fields.items() if info.is_required()],
        })
    return out


__all__ = ["components_json", "format_components", "jsonable_default"]
