"""docs/concepts.md's diagram of the core's layers and of a spec's path is the code's, not a drawing that drifts."""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

CONCEPTS = Path(__file__).resolve().parents[2] / "docs" / "concepts.md"


def _layers() -> list[tuple[str, set[str]]]:
    """LAYERS of test_core_layers.py, the layering its import test enforces."""
    spec = importlib.util.spec_from_file_location("core_layers_for_docs", Path(__file__).with_name("test_core_layers.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.LAYERS


LAYERS = _layers()


def block_after(marker: str) -> list[str]:
    """The lines of the ```text block that follows ``<!-- marker: ...-->`` in concepts.md."""
    text = CONCEPTS.read_text(encoding="utf-8")
    match = re.search(rf"<!-- {marker}:[^>]*-->\n```text\n(.*?)\n```", text, re.S)
    assert match, f"docs/concepts.md has no '{marker}' diagram"
    return match.group(1).splitlines()


def test_the_layer_diagram_is_the_layering_the_import_test_enforces():
    rows = {}
    for line in block_after("core-layers"):
        name, modules = re.split(r"\s{2,}", line.strip(), maxsplit=1)
        rows[name] = set(modules.split())
    drawn = list(rows.items())[::-1]  # the diagram is drawn top (entry points) down
    assert [name for name, _ in drawn] == [name for name, _ in LAYERS]
    for (name, modules), (_, expected) in zip(drawn, LAYERS):
        assert modules == expected, f"row {name!r} of docs/concepts.md: {sorted(modules ^ expected)} differ"


def test_every_step_of_the_spec_path_names_a_function_that_exists():
    steps = block_after("spec-path")
    assert steps[0].split()[0] == "specformer.build(path)"
    for line in steps:
        where = re.split(r"\s{2,}", line.strip())[1]
        for ref in where.split(" / "):
            parts = ref.strip().split(".")
            if parts[0][0].isupper():  # a class of the package: Decoder.init_weights
                import specformer
                target, rest = getattr(specformer, parts[0]), parts[1:]
            else:  # the longest module path, then attributes: model.sizes.estimate_resolved
                cut = max(i for i in range(1, len(parts)) if importlib.util.find_spec(f"specformer.{'.'.join(parts[:i])}"))
                target, rest = importlib.import_module(f"specformer.{'.'.join(parts[:cut])}"), parts[cut:]
            for part in rest:
                target = getattr(target, part)
            assert callable(target), ref


def test_the_spec_path_is_the_order_build_calls_it_in(tiny_spec, monkeypatch):
    import specformer
    from specformer.model import builder
    from specformer.spec import check

    order = []

    def spy(module, name, label):
        real = getattr(module, name)

        def wrapper(*args, **kwargs):
            order.append(label)
            return real(*args, **kwargs)
        monkeypatch.setattr(module, name, wrapper)

    from specformer.model import sizes

    from specformer.spec import size_check

    spy(check, "validate", "spec.validate.validate")
    spy(size_check, "check_sizes", "spec.size_check.check_sizes")
    spy(sizes, "estimate_resolved", "model.sizes.estimate_resolved")
    spy(check, "plugin_problems", "spec.validate.plugin_problems")
    spy(builder, "check_memory", "machine.memory.check_memory")
    spy(builder, "assemble", "model.assemble.assemble")
    spy(specformer.Decoder, "init_weights", "Decoder.init_weights")
    specformer.build(tiny_spec)
    drawn = [re.split(r"\s{2,}", line.strip())[1].split(" / ")[0] for line in block_after("spec-path")]
    assert order == [step for step in drawn if step in order]
    assert order == [s for s in drawn if s not in ("model.builder.build", "spec.shapes.read_spec_file")]
