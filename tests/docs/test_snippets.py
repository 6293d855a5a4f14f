"""Every spec snippet on the site validates against the live registry.

The convention (docs/_hooks/docsgen/snippets.py): a YAML block with a top-level
``model:`` is a whole spec; one whose first line starts with ``# fragment`` (or that holds
only plugin sections such as ``generate:``) is merged into specs/tiny.yaml; ``# not a
spec`` opts out; ``# needs plugin: DIST`` is checked where DIST is installed. JSON and
TOML blocks with a top-level ``model`` are whole specs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from docs_site import REPO
from docsgen.pages import generate  # noqa: E402
from docsgen.snippets import (  # noqa: E402
    SPEC_LANGUAGES,
    CodeBlock,
    check_block,
    code_blocks,
    merge,
    placements,
)
from specformer.registry.discovery import get_registry

DOCS = REPO / "docs"


def _written_pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if "_hooks" not in p.parts)


def _written_blocks() -> list[CodeBlock]:
    blocks = []
    for page in _written_pages():
        blocks += code_blocks(page.read_text(encoding="utf-8"), page=str(page.relative_to(REPO)))
    return [b for b in blocks if b.language in SPEC_LANGUAGES]


@pytest.mark.parametrize("block", _written_blocks(), ids=lambda b: f"{b.page}:{b.line}")
def test_written_snippet_validates(block: CodeBlock):
    check_block(block, get_registry())


def test_the_written_pages_hold_whole_specs_and_fragments():
    """Guard against the check quietly skipping everything (pages of other sessions add more)."""
    registry = get_registry()
    kinds = [check_block(b, registry) for b in _written_blocks()]
    assert kinds.count("spec") >= 5 and kinds.count("fragment") >= 3, kinds


@pytest.fixture(scope="module")
def generated():
    return generate(get_registry())


def test_every_component_has_a_snippet_that_validates(generated):
    registry = get_registry()
    placed = placements(registry)
    assert set(generated.snippets) == {f"{c.kind}/{c.name}" for c in registry}
    for c in registry:
        shown = generated.snippets[f"{c.kind}/{c.name}"]
        # Two snippets (smallest, every param) wherever a spec can name the component.
        assert len(shown) == (2 if c.kind in placed else 0), (c.kind, c.name)
    assert generated.snippet_errors() == []


def test_generated_pages_snippets_validate_by_the_same_convention(generated):
    registry = get_registry()
    checked = []
    for path, markdown in generated.pages.items():
        for block in code_blocks(markdown, page=path):
            if block.language in SPEC_LANGUAGES:
                checked.append(check_block(block, registry))
    assert checked.count("fragment") + checked.count("spec") >= len(registry), checked


def test_the_kinds_of_the_core_and_of_plugin_sections_have_a_place_in_a_spec():
    registry = get_registry()
    found = placements(registry)
    for kind in ("positional", "norm", "ffn", "mixer", "layout", "residual"):
        assert kind in found, f"no spec field takes a {kind!r} component"
    if "generate" in registry.sections:
        assert found["sampler"] == [("key", "generate"), ("key", "sampler"), ("item",)]
    assert found["norm"] == [("key", "model"), ("key", "block"), ("key", "norm")]
    assert found["positional"] == [("key", "model"), ("key", "positional")]
    assert found["residual"] == [("key", "model"), ("key", "block"), ("key", "residual")]


# -- the convention itself: it must reject what is wrong ------------------------------------


def _block(code: str, language: str = "yaml") -> CodeBlock:
    return CodeBlock("page.md", 1, language, code)


WHOLE = """\
model:
  vocab_size: 64
  d_model: 32
  n_layers: 2
  context_length: 16
  positional: rope
  block: {norm: rmsnorm, mixer: {kind: attention, n_heads: 4}, ffn: swiglu}
"""


def test_whole_spec_is_validated_and_its_problems_reported():
    registry = get_registry()
    assert check_block(_block(WHOLE), registry) == "spec"
    with pytest.raises(AssertionError, match=r"(?s)page.md:1: the spec does not validate:.*model.block.mixer: n_heads \(3\)"):
        check_block(_block(WHOLE.replace("n_heads: 4", "n_heads: 3")), registry)


def test_fragment_is_merged_into_the_base_spec():
    registry = get_registry()
    good = "# fragment\nmodel:\n  block:\n    norm: {kind: layernorm, bias: false}\n"
    assert check_block(_block(good), registry) == "fragment"
    with pytest.raises(AssertionError, match=r"model.block.norm.bais: unknown field"):
        check_block(_block(good.replace("bias", "bais")), registry)


def test_an_empty_model_stands_for_the_base_model():
    registry = get_registry()
    if "generate" not in registry.sections:
        pytest.skip("needs the generate plugin's section")
    block = "model:\n  # ... the architecture ...\ngenerate:\n  sampler: [{kind: top_k, k: 50}]\n"
    assert check_block(_block(block), registry) == "fragment"
    with pytest.raises(AssertionError, match=r"generate.sampler\[0\]"):
        check_block(_block(block.replace("k: 50", "k: 0")), registry)


def test_unmarked_partial_yaml_is_refused_and_marked_blocks_are_skipped():
    registry = get_registry()
    with pytest.raises(AssertionError, match="must be a complete spec"):
        check_block(_block("block:\n  norm: rmsnorm\n"), registry)
    assert check_block(_block("# not a spec: a pyproject excerpt\nname: x\n"), registry) == "skipped"
    assert check_block(_block("# needs plugin: specformer-no-such-dist\nmodel: {}\n"), registry) == "needs-plugin"
    assert check_block(_block('{"name": "x"}', "json"), registry) == "skipped"
    assert check_block(_block('[project]\nname = "x"\n', "toml"), registry) == "skipped"


def test_invalid_on_purpose_must_really_be_invalid():
    registry = get_registry()
    bad = "# invalid on purpose: n_heads does not divide d_model\n" + WHOLE.replace("n_heads: 4", "n_heads: 3")
    assert check_block(_block(bad), registry) == "invalid"
    with pytest.raises(AssertionError, match="marked invalid on purpose, but it validates"):
        check_block(_block("# invalid on purpose\n" + WHOLE), registry)


def test_toml_and_json_specs_are_validated():
    registry = get_registry()
    bad_toml = "[model]\nvocab_size = 64\n"
    with pytest.raises(AssertionError, match="required field is missing"):
        check_block(_block(bad_toml, "toml"), registry)
    with pytest.raises(AssertionError, match="required field is missing"):
        check_block(_block('{"model": {"vocab_size": 64}}', "json"), registry)


def test_code_blocks_are_found_inside_tabs_and_admonitions():
    markdown = '=== "YAML"\n\n    ```yaml\n    a: 1\n    ```\n\n!!! note\n    ~~~toml title="x"\n    b = 2\n    ~~~\n'
    blocks = code_blocks(markdown, page="p.md")
    assert [(b.language, b.code, b.line) for b in blocks] == [("yaml", "a: 1", 3), ("toml", "b = 2", 8)]


def test_merge_replaces_a_component_of_another_kind_and_merges_the_same_kind():
    base = {"model": {"block": {"norm": "rmsnorm", "mixer": {"kind": "attention", "n_heads": 4}}}}
    assert merge(base, {"model": {"block": {"mixer": {"window": 8}}}})["model"]["block"]["mixer"] == {
        "kind": "attention", "n_heads": 4, "window": 8}
    assert merge(base, {"model": {"block": {"norm": {"kind": "layernorm", "bias": False}}}})["model"]["block"]["norm"] == {
        "kind": "layernorm", "bias": False}
    assert merge(base, {"model": {"block": {"norm": {"kind": "rmsnorm", "eps": 1e-5}}}})["model"]["block"]["norm"] == {
        "kind": "rmsnorm", "eps": 1e-5}


# -- the catalogue with components it cannot show --------------------------------------------


def _registry_with(extra):
    from specformer.registry import discovery

    registry = discovery.build_registry(discovery.get_plugin_manager())
    extra(registry)
    return registry


def test_a_component_whose_snippet_cannot_validate_is_reported_by_name():
    from docsgen.catalogue import catalogue_pages
    from pydantic import Field
    from specformer.registry.params import Params

    class Picky(Params):
        width: int = Field(gt=0, description="Must equal 12345, which no example gives.")

    def factory(params, *, dim):
        raise ValueError(f"width must be 12345, got {params.width}")

    registry = _registry_with(lambda r: r.for_plugin("picky").register("norm", "pickynorm", factory=factory, params=Picky))
    _, snippets = catalogue_pages(registry)
    errors = [s.error for s in snippets["norm/pickynorm"] if s.error]
    assert errors and "width must be 12345" in errors[0] and "Field(examples=[...])" in errors[0]


def test_a_kind_no_spec_field_takes_gets_a_page_without_snippets():
    from docsgen.catalogue import catalogue_pages
    from pydantic import Field
    from specformer.registry.params import Params

    class RouterParams(Params):
        top: int = Field(default=1, gt=0, description="Experts per token.")

    # A kind of its own: the layers plugin's `router` is taken by moe's `router` field.
    def add(registry):
        registry.for_plugin("moe_extras").add_kind("dispatcher", doc="Chooses experts.", sizes=("d_model",))
        registry.for_plugin("moe_extras").register("dispatcher", "topk", factory=lambda params, *, d_model: None,
                                                   params=RouterParams, doc="Keep the best experts.")

    pages, snippets = catalogue_pages(_registry_with(add))
    assert "## topk { #topk }" in pages["catalogue/dispatcher.md"]
    assert "No spec field takes a `dispatcher` component" in pages["catalogue/dispatcher.md"]
    assert snippets["dispatcher/topk"] == []
    assert "[`topk`](dispatcher.md#topk)" in pages["catalogue/index.md"]
