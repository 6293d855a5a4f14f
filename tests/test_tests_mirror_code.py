"""tests/ mirrors the code: a test file named for a plugin's module lies in that plugin's test folder.

``test_<m>.py`` that imports ``specformer_<p>.<m>`` (or ``specformer_<p>.<...>.<m>``) is that module's test,
and belongs under ``tests/plugins/<p>/``; issue 48 found the text plugin's cache, corpus, sources and tokenizer
tests in tests/plugins/train/. A test of a module *through* another plugin (a trainer run reading a corpus) is
named for what it runs and is not caught here.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
PLUGINS = REPO / "plugins"


def _imported_modules(path: Path) -> set[str]:
    """Every module a file imports by name (``import a.b``, ``from a.b import c``: ``a.b`` and ``a.b.c``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _plugin_modules() -> dict[str, set[str]]:
    """Each plugin package -> the dotted names of its modules (``specformer_text.cache``, ...)."""
    modules: dict[str, set[str]] = {}
    for package in sorted(PLUGINS.glob("specformer_*/__init__.py")):
        root = package.parent
        modules[root.name] = {
            ".".join((root.name, *file.relative_to(root).with_suffix("").parts))
            for file in root.rglob("*.py") if file.name != "__init__.py" and "__pycache__" not in file.parts
        }
    return modules


def test_a_test_named_for_a_plugin_module_lies_in_that_plugins_folder() -> None:
    modules = _plugin_modules()
    misplaced = []
    for test in sorted(TESTS.rglob("test_*.py")):
        if "__pycache__" in test.parts:
            continue
        named = test.stem.removeprefix("test_")
        imported = _imported_modules(test)
        for package, dotted in modules.items():
            home = TESTS / "plugins" / package.removeprefix("specformer_")
            tested = sorted(m for m in dotted & imported if m.rsplit(".", 1)[-1] == named)
            if tested and home not in test.parents:
                misplaced.append(f"{test.relative_to(REPO)} tests {tested[0]}: move it to {home.relative_to(REPO)}/")
    assert misplaced == [], "\n".join(misplaced)


def test_the_rule_sees_the_text_plugins_tests() -> None:
    """The check above finds something to check: the text plugin's corpus test imports the module it is named for."""
    corpus_test = TESTS / "plugins" / "text" / "test_corpus.py"
    assert "specformer_text.corpus" in _imported_modules(corpus_test)
    assert "specformer_text.corpus" in _plugin_modules()["specformer_text"]
