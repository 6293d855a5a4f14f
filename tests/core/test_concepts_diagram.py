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
            module, _, name = ref.strip().partition(".")
            target = importlib.import_module(f"specformer.{module.lower()}") if module[0].islower() else None
            if target is None:  # a class of the package: Decoder.init_weights
                import specformer
                target = getattr(specformer, module)
            for part in name.split("."):
                target = getattr(target, part)
            assert callable(target), ref


def test_the_spec_path_is_the_order_build_calls_it_in(tiny_spec, monkeypatch):
    import specformer
    from specformer.model import builder
    from specformer.model import sizes

    order = []

    def spy(module, name, label):
        real = getattr(module, name)

        def wrapper(*args, **kwargs):
            order.append(label)
            return real(*args, **kwargs)
        monkeypatch.setattr(module, name, wrapper)

    spy(sizes, "validate", "validate.validate")
    spy(sizes, "estimate_resolved", "sizes.estimate_resolved")
    spy(sizes, "plugin_problems", "validate.plugin_problems")
    spy(builder, "check_memory", "memory.check_memory")
    spy(builder, "assemble", "assemble.assemble")
    spy(specformer.Decoder, "init_weights", "Decoder.init_weights")
    specformer.build(tiny_spec)
    drawn = [re.split(r"\s{2,}", line.strip())[1].split(" / ")[0] for line in block_after("spec-path")]
    assert order == [step for step in drawn if step in order]
    assert order == [s for s in drawn if s not in ("builder.build", "spec_shapes.read_spec_file")]
