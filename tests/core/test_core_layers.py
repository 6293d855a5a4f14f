"""The core imports in one direction: spec shapes <- validation <- building <- entry points.

Read from the source with ``ast``, so every import counts: top-level, function-local
and ``TYPE_CHECKING``-only alike (a late import that dodges a circle is still a circle).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "core" / "specformer"

#: The core's layers, bottom first. A module may import modules of its own layer or of
#: layers below it, never above. A new module must be placed here.
LAYERS: list[tuple[str, set[str]]] = [
    ("foundations", {"errors", "messages", "strict", "layer_groups", "positional", "context", "threads",
                     "version", "datafile", "memory", "tokenizer", "checkpoint_file", "attention", "atomic", "devices",
                     "masks", "outputs", "byte_tokenizer_file", "tokenizer_choice"}),
    ("spec shapes", {"spec_shapes"}),
    ("registry and plugins", {"registry", "hookspecs", "plugins", "params"}),
    ("validation", {"validate", "provenance"}),
    ("building", {"decoder", "assemble", "sizes"}),
    ("entry points", {"spec", "builder", "summary", "checkpoint_check", "checkpoint", "schema", "catalogue",
                      "scaffold", "cli"}),
]


def core_modules() -> set[str]:
    return {p.stem for p in CORE.glob("*.py")} - {"__init__"}


def imports_of(module: str, modules: set[str]) -> set[str]:
    """The core modules ``module`` imports anywhere in its source (``"specformer"`` for the package root)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse((CORE / f"{module}.py").read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[0] != "specformer":
                continue
            if len(parts) > 1:
                found.add(parts[1])
            else:  # from specformer import x: a module, or a name of the package root
                found |= {a.name if a.name in modules else "specformer" for a in node.names}
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "specformer":
                    found.add(parts[1] if len(parts) > 1 else "specformer")
    return found - {module}


def import_graph() -> dict[str, set[str]]:
    modules = core_modules()
    return {m: imports_of(m, modules) for m in modules}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` as a path that returns to its start, or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = "open"
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == "open":
                return stack[stack.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        state[m] = "done"
        stack.pop()
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_the_core_import_graph_has_no_circle():
    assert find_cycle(import_graph()) is None, f"core modules import each other in a circle: {find_cycle(import_graph())}"


def test_no_core_module_imports_the_package_root():
    # `from specformer import x` runs specformer/__init__, which imports the whole core.
    offenders = sorted(m for m, deps in import_graph().items() if "specformer" in deps)
    assert offenders == []


def test_every_core_module_has_a_layer():
    placed = set().union(*(mods for _, mods in LAYERS))
    assert sorted(core_modules() - placed) == [], "place each new core module in LAYERS"


def test_imports_go_down_the_layers_only():
    rank = {m: i for i, (_, mods) in enumerate(LAYERS) for m in mods}
    upward = [
        f"{m} ({LAYERS[rank[m]][0]}) imports {d} ({LAYERS[rank[d]][0]})"
        for m, deps in sorted(import_graph().items())
        for d in sorted(deps)
        if d in rank and m in rank and rank[d] > rank[m]
    ]
    assert upward == []


def test_spec_shapes_know_no_registry_and_validation_no_building():
    graph = import_graph()

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for n in graph.get(todo.pop(), ()):
                if n not in seen:
                    seen.add(n)
                    todo.append(n)
        return seen

    assert reach("spec_shapes") & {"registry", "plugins", "params", "validate", "sizes", "builder"} == set()
    assert reach("validate") & {"assemble", "decoder", "sizes", "builder", "spec"} == set()
    assert "validate" in reach("sizes") and "sizes" in reach("builder")


@pytest.mark.parametrize("graph, circle", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
    ({"a": {"b"}, "b": set(), "c": {"a", "b"}}, None),
])
def test_the_cycle_finder_finds_circles(graph, circle):
    assert find_cycle(graph) == circle


def test_late_and_type_checking_imports_count(tmp_path, monkeypatch):
    (tmp_path / "one.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from specformer.two import X\n"
        "def f():\n    import specformer.three\n    from specformer import version, __version__\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "CORE", tmp_path)
    assert imports_of("one", {"one", "two", "three", "version"}) == {"two", "three", "version", "specformer"}
