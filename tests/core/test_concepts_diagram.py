"""docs/concepts.md's diagram of the core's layers and of a spec's path is the code's, not a drawing that drifts."""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

from fixtures.tiny import tiny_spec

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


def test_the_spec_path_is_the_order_build_calls_it_in(fresh_tiny_spec, monkeypatch):
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
    specformer.build(fresh_tiny_spec)
    drawn = [re.split(r"\s{2,}", line.strip())[1].split(" / ")[0] for line in block_after("spec-path")]
    assert order == [step for step in drawn if step in order]
    assert order == [s for s in drawn if s not in ("model.builder.build", "spec.shapes.read_spec_file")]


def test_the_residual_streams_shapes_are_what_a_forward_on_hyper_connections_takes(fresh_tiny_spec):
    import torch

    import specformer

    mhc_block = {**fresh_tiny_spec["model"]["block"], "residual": {"kind": "mhc", "n_streams": 4}}
    spec = {**fresh_tiny_spec, "model": {**fresh_tiny_spec["model"], "block": mhc_block}}
    model = specformer.build(spec, seed=0)
    sizes = {"B": 2, "T": 5, "N": 4, "D": model.d_model, "V": model.vocab_size}
    seen: dict[str, tuple[int, ...]] = {}

    def record(owner, name, label, pick=lambda out: out):
        real = getattr(owner, name)

        def wrapper(*args, **kwargs):
            out = real(*args, **kwargs)
            seen.setdefault(label, tuple(pick(out).shape))
            return out
        setattr(owner, name, wrapper)

    def hook(label):
        def observe(_module, _args, out) -> None:
            seen.setdefault(label, tuple(out.shape))
        return observe

    block = model.blocks[0]
    model.embedding.register_forward_hook(hook("Decoder.embedding"))
    block.mixer.register_forward_hook(hook("attention / ffn"))
    record(model.residual, "expand", "ResidualStream.expand")
    record(model.residual, "collapse", "ResidualStream.collapse")
    record(block.attention_residual, "read", "ResidualConnection.read", pick=lambda out: out[0])
    record(block.attention_residual, "write", "ResidualConnection.write")
    seen["Decoder.head_logits"] = tuple(model(torch.randint(0, model.vocab_size, (2, 5))).shape)

    from specformer.model import residual

    drawn = [re.split(r"\s{2,}", line.strip()) for line in block_after("residual-streams")]
    drawn = [row for row in drawn if len(row) == 3]
    assert sorted(where for _, where, _ in drawn) == sorted(seen)
    for _, where, shape in drawn:
        cls, _, method = where.partition(".")
        if cls.startswith("Residual"):
            assert callable(getattr(getattr(residual, cls), method)), where
        assert seen[where] == tuple(sizes[s] for s in shape.strip("()").split(", ")), (where, shape, seen[where])


#: The model the shared-caches picture is drawn for: six layers, a window of 4 on the even ones, the last two reading
#: the keys and values of the last two that keep their own (Gemma 4's pattern at toy size).
SHARED_KV_SPEC = tiny_spec(
    vocab_size=32, n_layers=6, context_length=64, block={"ffn": "swiglu"},
    layers=[{"select": "0::2", "mixer": {"window": 4}}, {"select": 4, "mixer": {"kv_from": 2}},
            {"select": 5, "mixer": {"kv_from": 3}}])


def draw_shared_caches(model) -> list[str]:
    """What each layer of ``model`` keeps per sequence, from each attention's public facts (window, kv_from)."""
    from specformer.model.attention import cache_slots_of, kv_source_of

    layers = model.attention_modules()
    lines = []
    for i, layer in enumerate(layers):
        source = kv_source_of(layer)
        span = f"window {layer.window}" if layer.window is not None else "global"
        if source is not None:
            kept = f"nothing: reads layer {source}'s"
        else:
            slots = cache_slots_of(layer)
            pair = f"[k v] ({slots.key_heads}x{slots.key_dim} + {slots.value_heads}x{slots.value_dim})"
            kept = f"{pair} x {layer.window}, a ring" if layer.window is not None else f"{pair} x n"
        readers = [j for j, other in enumerate(layers) if kv_source_of(other) == i]
        read_by = f"  <- read by layer {', '.join(map(str, readers))}" if readers else ""
        lines.append(f"layer {i}  {span:<9} {kept}{read_by}".rstrip())
    return lines


def test_the_shared_caches_picture_is_what_the_layers_declare():
    import specformer

    assert block_after("shared-kv") == draw_shared_caches(specformer.build(SHARED_KV_SPEC))
