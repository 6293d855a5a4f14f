"""Spec snippets in the docs: writing them for components, finding them in pages, validating them.

The convention every page follows (``tests/docs`` enforces it on every page):

* a ```` ```yaml ```` block with a top-level ``model:`` is a complete spec and must
  validate on its own;
* a block whose first line starts with ``# fragment`` is part of a spec, written from
  the spec's root; it must validate once merged into ``specs/tiny.yaml`` (mappings merge
  key by key; a component with a different ``kind`` replaces the base one whole);
* a block whose top-level keys are all spec sections (``train:``, ``generate:``), or
  whose ``model:`` is left empty (``model:  # ... the architecture ...``), is merged the
  same way;
* a block whose first line starts with ``# not a spec`` is not checked;
* a block whose first line starts with ``# invalid on purpose`` must fail validation
  (the examples of error messages);
* a block whose first line is ``# needs plugin: <distribution>`` is checked by the rules
  above only where that distribution is installed (the plugin tutorial's snippets);
* JSON and TOML blocks are checked when they have a top-level ``model``.
"""

from __future__ import annotations

import copy
import functools
import importlib.metadata
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib
import yaml
from specformer.errors import SpecError
from specformer.registry.components import Component, Registry
from specformer.registry.schema import spec_json_schema
from specformer.spec import load_spec, read_spec_file

REPO = Path(__file__).resolve().parents[3]
BASE_SPEC = REPO / "specs" / "tiny.yaml"
FRAGMENT_MARK = "# fragment"
NOT_A_SPEC_MARK = "# not a spec"
NEEDS_PLUGIN_MARK = "# needs plugin:"
INVALID_MARK = "# invalid on purpose"
FRAGMENT_HEADER = "# fragment: merged into a full spec such as specs/tiny.yaml"
#: The smallest sensible model: head_dim 2, so per-channel params need a single value.
SMALLEST: dict[str, Any] = {
    "model": {
        "vocab_size": 32,
        "d_model": 8,
        "n_layers": 1,
        "context_length": 16,
        "positional": "rope",
        "block": {"norm": "rmsnorm", "mixer": {"kind": "attention", "n_heads": 4}, "ffn": "swiglu"},
    }
}


# -- merging ----------------------------------------------------------------------------


@functools.cache
def _base_spec() -> dict[str, Any]:
    return read_spec_file(BASE_SPEC)


def base_spec() -> dict[str, Any]:
    return copy.deepcopy(_base_spec())


def forget_files() -> None:
    """Read the spec files and pages again next time (each docs build starts with this)."""
    _base_spec.cache_clear()
    written_components.cache_clear()


def merge(base: Any, change: Any) -> Any:
    """``change`` laid over ``base``; a component of another ``kind`` replaces the old one whole."""
    if isinstance(base, str) and isinstance(change, dict) and "kind" in change:
        base = {"kind": base}
    if not (isinstance(base, dict) and isinstance(change, dict)):
        return copy.deepcopy(change)
    if "kind" in base and "kind" in change and base["kind"] != change["kind"]:
        return copy.deepcopy(change)
    out = copy.deepcopy(base)
    for key, value in change.items():
        out[key] = merge(out[key], value) if key in out else copy.deepcopy(value)
    return out


def validate_fragment(fragment: dict[str, Any], *, registry: Registry | None = None) -> None:
    """Raise :class:`SpecError` unless ``fragment`` merged into the base spec validates (sizes too)."""
    load_spec(merge(base_spec(), fragment), registry=registry)


# -- where a kind is written in a spec ---------------------------------------------------

Step = tuple  # ("key", name) | ("item",) | ("component", kind, name)


def placements(registry: Registry) -> dict[str, list[Step]]:
    """For every kind that a spec can name, the shortest path from the spec root to it.

    Found by walking the spec's JSON schema (``specformer schema``), so a kind a plugin
    adds, used in a section it registers or inside another component's params, is found
    without being listed here.
    """
    schema = spec_json_schema(registry)
    defs = schema.get("$defs", {})
    # Between places equally near, the one inside the component registered first (moe's router before moa's).
    order = {(c.kind, c.name): i for i, c in enumerate(registry)}
    found: dict[str, list[Step]] = {}
    queue: list[tuple[dict[str, Any], list[Step], frozenset[str]]] = [(schema, [], frozenset())]
    while queue:
        node, path, seen = queue.pop(0)
        if not isinstance(node, dict):
            continue
        ref = node.get("$ref")
        if ref:
            name = ref.rsplit("/", 1)[-1]
            if name in seen:
                continue
            if name.endswith("-component"):
                kind = name[: -len("-component")]
                if kind not in found or _rank(path, kind, order) < _rank(found[kind], kind, order):
                    found[kind] = path
                for alt in defs.get(name, {}).get("oneOf", []):
                    if alt.get("type") == "object" and alt.get("title"):
                        queue.append((alt, [*path, ("component", kind, alt["title"])], seen | {name}))
            else:
                queue.append((defs.get(name, {}), path, seen | {name}))
            continue
        for key in ("anyOf", "oneOf", "allOf"):
            for sub in node.get(key, []):
                queue.append((sub, path, seen))
        for prop, sub in (node.get("properties") or {}).items():
            if prop != "kind":
                queue.append((sub, [*path, ("key", prop)], seen))
        if isinstance(node.get("items"), dict):
            queue.append((node["items"], [*path, ("item",)], seen))
    # The natural place first: the field named after the kind (``block.norm`` before ``final_norm``).
    return dict(sorted(found.items()))


def _rank(path: list[Step], kind: str, order: dict[tuple[str, str], int]) -> tuple[int, int, tuple[int, ...]]:
    last = path[-1] if path else ("",)
    inside = tuple(order.get((step[1], step[2]), 0) for step in path if step[0] == "component")
    return (0 if last[0] == "key" and last[1] == kind else 1, len(path), inside)


def place(path: list[Step], leaf: Any, registry: Registry) -> dict[str, Any]:
    """The spec fragment that puts ``leaf`` at ``path``."""
    value = leaf
    for step in reversed(path):
        if step[0] == "key":
            value = {step[1]: value}
        elif step[0] == "item":
            value = [value]
        else:
            _, kind, name = step
            value = {"kind": name, **minimal_params(registry.get(kind, name), registry)[0], **value}
    return value


# -- example params -----------------------------------------------------------------------


def _component_mappings(node: Any, out: list[dict[str, Any]]) -> None:
    if isinstance(node, dict):
        if isinstance(node.get("kind"), str):
            out.append(node)
        for v in node.values():
            _component_mappings(v, out)
    elif isinstance(node, list):
        for v in node:
            _component_mappings(v, out)


@functools.cache
def written_components() -> list[dict[str, Any]]:
    """Every component mapping people wrote: in the example specs (``specs/``), then in the docs' YAML."""
    out: list[dict[str, Any]] = []
    # The base spec first: its values fit the base spec's sizes by construction.
    for path in [BASE_SPEC, *sorted(p for p in (REPO / "specs").glob("*") if p != BASE_SPEC)]:
        try:
            _component_mappings(read_spec_file(path), out)
        except SpecError:
            continue
    for page in sorted((REPO / "docs").rglob("*.md")):
        for block in code_blocks(page.read_text(encoding="utf-8"), page=str(page)):
            if block.language in ("yaml", "yml"):
                try:
                    _component_mappings(yaml.safe_load(block.code), out)
                except yaml.YAMLError:
                    continue
    return out


def synthesize(node: dict[str, Any], *, count: int = 1) -> Any:
    """A value that fits a JSON-schema node's type and bounds (the last resort for an example).

    ``count`` is the integer tried first (1, then 8: a size such as a context length of 1
    is legal but degenerate).
    """
    for key in ("anyOf", "oneOf"):
        options = [n for n in node.get(key, []) if n.get("type") != "null"]
        if options:
            return synthesize(options[0], count=count)
    if "enum" in node:
        return node["enum"][0]
    if "const" in node:
        return node["const"]
    kind = node.get("type")
    if kind in ("integer", "number"):
        lo = node.get("minimum", node.get("exclusiveMinimum"))
        hi = node.get("maximum", node.get("exclusiveMaximum"))
        if kind == "integer":
            low = int(node["exclusiveMinimum"]) + 1 if "exclusiveMinimum" in node else lo
            value = max(low if low is not None else count, count)
            return value if hi is None or value <= hi else low
        if lo is not None and hi is not None:
            return (lo + hi) / 2
        return float(max(lo, 1.0)) if lo is not None else (float(hi) - 1.0 if hi is not None else 1.0)
    if kind == "array":
        return [synthesize(node["items"], count=count)] if isinstance(node.get("items"), dict) else []
    return {"boolean": False, "string": "", "object": {}}.get(kind)


def minimal_params(component: Component, registry: Registry) -> list[dict[str, Any]]:
    """Candidate values for the required params of ``component`` (at least one candidate, maybe {}).

    In order: the fields' ``examples``; the values written for this component in an
    example spec or in the docs; those written for another component of the same kind
    with the same params; values synthesized from each field's type and bounds.
    """
    fields = component.params.model_fields
    required = [n for n, f in fields.items() if f.is_required()]
    if not required:
        return [{}]
    candidates: list[dict[str, Any]] = []
    from_examples = {n: fields[n].examples[0] for n in required if fields[n].examples}
    if len(from_examples) == len(required):
        candidates.append(from_examples)
    written = written_components()
    same = [w for w in written if w["kind"] == component.name and all(n in w for n in required)]
    kin = [
        w for w in written
        if w["kind"] in registry.names(component.kind) and w["kind"] != component.name and all(n in w for n in required)
    ]
    for w in same + kin:
        candidate = {**{n: w[n] for n in required}, **from_examples}
        if candidate not in candidates:
            candidates.append(candidate)
    props = component.params.model_json_schema().get("properties", {})
    for count in (1, 8):
        synthesized = {n: synthesize(props.get(n, {}), count=count) for n in required}
        if {**synthesized, **from_examples} not in candidates:
            candidates.append({**synthesized, **from_examples})
    return candidates


@dataclass
class ComponentSnippet:
    """The smallest spec fragment that uses a component, and whether it validated."""

    yaml: str
    fragment: dict[str, Any] | None
    error: str | None


def component_snippet(component: Component, registry: Registry, paths: dict[str, list[Step]], *, full: bool = False) -> ComponentSnippet:
    """A validated fragment naming ``component`` (with only its required params unless ``full``)."""
    path = paths.get(component.kind)
    if path is None:
        leaf = {"kind": component.name, **minimal_params(component, registry)[0]}
        return ComponentSnippet(
            f"{NOT_A_SPEC_MARK}: no spec field takes a {component.kind} component\n{dump(leaf)}",
            None,
            f"no field of the spec schema takes a {component.kind!r} component",
        )
    error = None
    first = None
    candidates = []
    # What else a spec using the component needs, when its Params say (per-layer inputs need a layout that takes them).
    context = getattr(component.params, "snippet_context", None) or {}
    # The nearest place first; then the same place in the other components of the holder's kind (an indexer
    # that only latent attention takes, where plain attention takes another).
    hosts = [i for i, step in enumerate(path) if step[0] == "component"]
    paths_tried = [path] + ([[*path[:hosts[-1]], ("component", path[hosts[-1]][1], name), *path[hosts[-1] + 1:]]
                             for name in registry.names(path[hosts[-1]][1]) if name != path[hosts[-1]][2]]
                            if hosts else [])
    for where in paths_tried:
        for params in minimal_params(component, registry):
            leaf = {"kind": component.name, **params}
            if full:
                from docsgen.fields import jsonable

                leaf = {"kind": component.name}
                for k, v in component.defaults().items():
                    leaf[k] = params.get(k) if v is ... else jsonable(v)
            try:
                candidates.append(merge(context, place(where, leaf, registry)))
            except Exception:  # a holder whose own example does not build here: not a place to show it
                continue
    # A fragment of specs/tiny.yaml reads best; a component whose params only fit other
    # sizes (one value per rotary pair, say) is shown as a whole spec on the smallest model.
    for fragment in candidates:
        first = first or fragment
        try:
            validate_fragment(fragment, registry=registry)
        except SpecError as exc:
            error = error or str(exc)
            continue
        except Exception as exc:  # a component that crashes on legal params: say so, loudly
            error = error or f"validating raised {type(exc).__name__}: {exc} (a bug: bad params must be a SpecError)"
            continue
        return ComponentSnippet(f"{FRAGMENT_HEADER}\n{dump(fragment)}", fragment, None)
    for fragment in candidates:
        whole = merge(SMALLEST, fragment)
        try:
            load_spec(whole, registry=registry)
        except Exception:
            continue
        return ComponentSnippet(dump(whole), whole, None)
    assert first is not None
    required = [n for n, f in component.params.model_fields.items() if f.is_required()]
    hint = f" (give its required params {', '.join(required)} Field(examples=[...]))" if required else ""
    return ComponentSnippet(f"{FRAGMENT_HEADER}\n{dump(first)}", first, f"{error}{hint}")


# -- YAML that reads like a person wrote it ------------------------------------------------


def _scalar(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 16).strip()
    return text[:-4].strip() if text.endswith("\n...") else text.removesuffix("...").strip()


def _flow(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    return _scalar(value)


def dump(value: Any, indent: int = 0) -> str:
    """Block style for the path into the spec, flow style (``{kind: rmsnorm}``) for components."""
    pad = "  " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for key, v in value.items():
            if isinstance(v, dict) and ("kind" in v and len(_flow(v)) <= 72 or not v):
                lines.append(f"{pad}{key}: {_flow(v)}")
            elif isinstance(v, (dict, list)) and v:
                lines.append(f"{pad}{key}:")
                lines.append(dump(v, indent + 1))
            else:
                lines.append(f"{pad}{key}: {_flow(v)}")
    elif isinstance(value, list):
        for v in value:
            if isinstance(v, dict) and not ("kind" in v and len(_flow(v)) <= 72):
                inner = dump(v, indent + 1).lstrip()
                lines.append(f"{pad}- {inner}")
            else:
                lines.append(f"{pad}- {_flow(v)}")
    else:
        lines.append(pad + _flow(value))
    return "\n".join(lines)


# -- code blocks in Markdown -----------------------------------------------------------------

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})\s*\{?\s*\.?(?P<lang>[\w+-]*)")


@dataclass
class CodeBlock:
    page: str
    line: int
    language: str
    code: str


def code_blocks(markdown: str, *, page: str) -> list[CodeBlock]:
    """Every fenced code block of a page (inside admonitions and tabs too), dedented."""
    blocks: list[CodeBlock] = []
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence, lang = match["indent"], match["fence"], match["lang"].lower()
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not (lines[j].strip().startswith(fence) and lines[j].strip().strip(fence[0]) == ""):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        blocks.append(CodeBlock(page, i + 1, lang, "\n".join(body)))
        i = j + 1
    return blocks


SPEC_LANGUAGES = {"yaml", "yml", "json", "toml"}


def check_block(block: CodeBlock, registry: Registry) -> str:
    """Validate one code block by the convention above; return how it was checked.

    Raises ``AssertionError`` with the page, line and problems when it does not hold.
    """
    where = f"{block.page}:{block.line}"
    first = next((line.strip() for line in block.code.splitlines() if line.strip()), "")
    if first.startswith(NEEDS_PLUGIN_MARK):
        distribution = first[len(NEEDS_PLUGIN_MARK):].strip()
        try:
            importlib.metadata.distribution(distribution)
        except importlib.metadata.PackageNotFoundError:
            return "needs-plugin"
        rest = block.code.split(first, 1)[1]
        return check_block(CodeBlock(block.page, block.line, block.language, rest), registry)
    if block.language in ("yaml", "yml"):
        if first.startswith(NOT_A_SPEC_MARK):
            return "skipped"
        try:
            data = yaml.safe_load(block.code)
        except yaml.YAMLError as exc:
            raise AssertionError(f"{where}: YAML block does not parse: {exc}") from None
        if first.startswith(INVALID_MARK):
            return _check_invalid(block, data, registry, where)
        if isinstance(data, dict) and "model" in data and data["model"] is None:
            # ``model:`` left empty ("# ... the architecture ...") stands for any model: the base one.
            data = {k: v for k, v in data.items() if k != "model"}
            kind = "fragment"
        elif first.startswith(FRAGMENT_MARK):
            kind = "fragment"
        elif isinstance(data, dict) and "model" in data:
            kind = "spec"
        elif isinstance(data, dict) and data and all(k in registry.sections for k in data):
            kind = "fragment"
        else:
            raise AssertionError(
                f"{where}: a YAML block must be a complete spec (top-level 'model:'), start with "
                f"'{FRAGMENT_MARK}' (merged into specs/tiny.yaml), hold only spec sections "
                f"({', '.join(sorted(registry.sections)) or 'none registered'}), or start with '{NOT_A_SPEC_MARK}'"
            )
    elif block.language in ("json", "toml"):
        try:
            data = json.loads(block.code) if block.language == "json" else tomllib.loads(block.code)
        except (json.JSONDecodeError, tomllib.TOMLDecodeError):
            return "skipped"  # a shell transcript or a partial pyproject, not a spec
        if not (isinstance(data, dict) and "model" in data):
            return "skipped"
        kind = "spec"
    else:
        return "skipped"
    try:
        if kind == "spec":
            load_spec(data, registry=registry)
        else:
            validate_fragment(data or {}, registry=registry)
    except SpecError as exc:
        raise AssertionError(f"{where}: the {kind} does not validate:\n{exc}\n--- block ---\n{block.code}") from None
    return kind


def _check_invalid(block: CodeBlock, data: Any, registry: Registry, where: str) -> str:
    try:
        load_spec(data if isinstance(data, dict) else {}, registry=registry)
    except SpecError:
        return "invalid"
    raise AssertionError(f"{where}: the block is marked invalid on purpose, but it validates:\n{block.code}")
