"""The core imports in one direction: spec shapes <- validation <- building <- entry points.

Read from the source with ``ast``, so every import counts: top-level, function-local
and ``TYPE_CHECKING``-only alike (a late import that dodges a circle is still a circle).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.imports import find_cycle

CORE = Path(__file__).resolve().parents[2] / "core" / "specformer"

#: The core's layers, bottom first, by module path under ``specformer`` (``spec`` is the
#: spec package's root, which holds ``load_spec``). A module may import modules of its own
#: layer or of layers below it, never above. A new module must be placed here.
LAYERS: list[tuple[str, set[str]]] = [
    ("foundations", {"errors", "messages", "renamed", "version", "lazy", "files.datafile", "files.atomic", "files.outputs",
                     "machine.threads", "machine.devices", "machine.memory", "machine.allocation", "tokenizers.tokenizer",
                     "tokenizers.byte_file", "tokenizers.choice", "checkpoint.file", "checkpoint.locate"}),
    ("model contracts", {"model.positional", "model.attention", "model.state", "model.context", "model.masks",
                         "model.sized", "model.sized_by_building", "model.residual", "model.parallel_plan",
                         "model.tensor_parallel", "model.expert_parallel", "model.shared"}),
    ("spec shapes", {"spec.strict", "spec.layer_groups", "spec.shapes"}),
    ("registry and plugins", {"registry.components", "registry.params", "registry.hookspecs", "registry.discovery",
                              "registry.schema"}),
    ("validation", {"spec.file_order", "spec.validate", "checkpoint.provenance"}),
    ("building", {"model.wiring", "spec.size_check", "model.decoder", "model.head_bias", "model.mtp", "model.assemble", "model.sizes"}),
    ("the spec pipeline", {"spec.check"}),
    ("entry points", {"spec", "model.builder", "model.summary", "model.device_plan", "checkpoint.check", "checkpoint.save_load",
                      "cli.catalogue", "cli.scaffold", "cli.main", "cli.__main__"}),
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(CORE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_docstring_only(path: Path) -> bool:
    body = ast.parse(path.read_text(encoding="utf-8")).body
    return all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body)


def core_modules() -> set[str]:
    """Every core module by its path under ``specformer``; package roots that only document their package are not modules."""
    return {_module_name(p) for p in CORE.rglob("*.py") if _module_name(p) and not _is_docstring_only(p)}


def _source_of(module: str) -> Path:
    path = CORE.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _resolve(dotted: list[str], modules: set[str]) -> str:
    """The longest core module a dotted path (under ``specformer``) names; ``"specformer"`` for the package root."""
    for end in range(len(dotted), 0, -1):
        if ".".join(dotted[:end]) in modules:
            return ".".join(dotted[:end])
    return ".".join(dotted[:1]) or "specformer"


def imports_of(module: str, modules: set[str]) -> set[str]:
    """The core modules ``module`` imports anywhere in its source (``"specformer"`` for the package root)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(_source_of(module).read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[0] != "specformer":
                continue
            for alias in node.names:  # `from specformer.registry import hookspecs` names a module
                found.add(_resolve([*parts[1:], alias.name], modules) if len(parts) > 1 or alias.name in modules
                          else "specformer")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "specformer":
                    found.add(_resolve(parts[1:], modules) if len(parts) > 1 else "specformer")
    return found - {module}


def import_graph() -> dict[str, set[str]]:
    modules = core_modules()
    return {m: imports_of(m, modules) for m in modules}


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

    assert reach("spec.shapes") & {"registry.components", "registry.discovery", "registry.params", "spec.validate",
                                   "model.sizes", "model.builder"} == set()
    assert reach("spec.validate") & {"model.assemble", "model.decoder", "model.sizes", "model.builder", "spec.check"} == set()
    assert "spec.validate" in reach("spec.check") and "model.sizes" in reach("spec.check") and "spec.check" in reach("model.builder")


def test_reading_a_spec_and_the_registry_do_not_import_torch():
    # `specformer validate`/`schema`/`components` start without torch (issue: start-up); only sizing and building need it.
    code = ("import sys, specformer, specformer.spec, specformer.registry.components, specformer.registry.params, "
            "specformer.registry.schema, specformer.spec.check; "
            "print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize("graph, circle", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
    ({"a": {"b"}, "b": set(), "c": {"a", "b"}}, None),
])
def test_the_cycle_finder_finds_circles(graph, circle):
    assert find_cycle(graph) == circle


def test_late_and_type_checking_imports_count(tmp_path, monkeypatch):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "one.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from specformer.two import X\n"
        "def f():\n    import specformer.three\n    from specformer import version, __version__\n"
        "    from specformer.pkg import inner\n    from specformer.pkg.inner import thing\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "CORE", tmp_path)
    modules = {"one", "two", "three", "version", "pkg.inner"}
    assert imports_of("one", modules) == {"two", "three", "version", "specformer", "pkg.inner"}
