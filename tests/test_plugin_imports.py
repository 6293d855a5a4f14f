"""The plugins' modules import in no circle, and each import inside a plugin's function says why it is there.

Read from source with ``ast``: an import inside a function counts as any other, so a late
import cannot hide a circle (docs/architecture.md, "Imports inside functions").
"""

from __future__ import annotations

import ast
from pathlib import Path

from fixtures.imports import find_cycle, function_level_imports

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PLUGINS).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def plugin_graph() -> dict[str, set[str]]:
    """``{module: the plugin modules it imports anywhere}`` over every built-in plugin (package roots that import their
    names on first use import nothing)."""
    modules = {_module_name(p): p for p in PLUGINS.rglob("*.py")}

    def resolve(dotted: str) -> str | None:
        parts = dotted.split(".")
        for end in range(len(parts), 0, -1):
            if ".".join(parts[:end]) in modules:
                return ".".join(parts[:end])
        return None

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found |= {resolve(f"{node.module}.{alias.name}") or resolve(node.module) for alias in node.names}
            elif isinstance(node, ast.Import):
                found |= {resolve(alias.name) for alias in node.names}
        graph[module] = {m for m in found if m} - {module}
    return graph


def test_the_plugins_import_in_no_circle() -> None:
    graph = plugin_graph()
    assert "specformer_train.parallel.distributed" in graph["specformer_train.checkpointing"]  # the graph is read
    assert find_cycle(graph) is None, f"plugin modules import each other in a circle: {find_cycle(graph)}"


def test_every_import_inside_a_function_says_why_it_is_late() -> None:
    unmarked = [f"{path.relative_to(PLUGINS)}:{line}" for path in sorted(PLUGINS.rglob("*.py"))
                for line, lines in function_level_imports(path) if not any("# late:" in text for text in lines)]
    assert unmarked == [], "an import inside a function needs a `# late: <reason>` comment (docs/architecture.md)"


def test_the_late_comment_finder_reads_groups_and_tries(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "def a():\n    # late: optional\n    import x\n\n    from y import z\n"
        "def b():\n    try:  # late: optional\n        import x\n    except ImportError:\n        pass\n"
        "def c():\n    value = 1\n    import x\n")
    marked = {line: any("# late:" in text for text in lines) for line, lines in function_level_imports(tmp_path / "m.py")}
    assert marked == {3: True, 5: True, 8: True, 13: False}
