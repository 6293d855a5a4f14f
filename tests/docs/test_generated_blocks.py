"""Generated blocks live in the Markdown (so a page reads the same anywhere) and are never stale."""

from __future__ import annotations

import re

import pytest

import specformer
from docsgen.snippets import REPO
from docsgen.transcripts import MARKER, markdown_pages, refresh
from specformer.registry.discovery import get_registry


@pytest.mark.parametrize("page", markdown_pages(), ids=lambda p: str(p.relative_to(REPO / "docs")))
def test_every_generated_block_is_up_to_date(page):
    text = page.read_text(encoding="utf-8")
    fresh = refresh(text)
    assert all(code in (0, 2) for _, code in fresh.ran), f"{page}: a command crashed: {fresh.ran}"
    assert fresh.text == text, f"{page.relative_to(REPO)} is stale: run `make docs-refresh` and commit the result"


def test_no_page_keeps_a_placeholder_that_only_the_site_would_fill():
    for page in markdown_pages():
        text = page.read_text(encoding="utf-8")
        assert '--8<--' not in text, f"{page}: a snippet include shows as a raw line outside the site; use " \
                                     "<!-- specformer-include: PATH --> and make docs-refresh"
        lines = text.split("\n")
        for i, line in enumerate(lines):
            if MARKER.match(line):
                assert i + 1 < len(lines) and lines[i + 1].lstrip().startswith(("```", "~~~")), \
                    f"{page}:{i + 1}: a marker without its generated block"


def test_an_output_marker_gets_the_command_and_what_it_printed():
    fresh = refresh("before\n<!-- specformer-output: validate specs/tiny.yaml -->\nafter\n")
    assert fresh.ran == [("validate specs/tiny.yaml", 0)]
    assert fresh.text == ("before\n<!-- specformer-output: validate specs/tiny.yaml -->\n```console\n"
                          "$ specformer validate specs/tiny.yaml\nspecs/tiny.yaml: ok\n```\nafter\n")
    assert refresh(fresh.text).text == fresh.text  # refreshing a fresh page changes nothing


def test_a_stale_block_is_replaced_and_the_authors_fence_kept():
    stale = "<!-- specformer-include: specs/tiny.yaml -->\n```yaml title=\"tiny\"\nold: text\n```\nafter"
    fresh = refresh(stale).text
    body = (REPO / "specs" / "tiny.yaml").read_text(encoding="utf-8").rstrip("\n")
    assert fresh == f"<!-- specformer-include: specs/tiny.yaml -->\n```yaml title=\"tiny\"\n{body}\n```\nafter"


def test_a_failing_command_shows_its_exit_code():
    fresh = refresh("<!-- specformer-output: validate no/such.yaml -->")
    assert fresh.ran == [("validate no/such.yaml", 2)]
    assert fresh.text.endswith("$ echo $?\n2\n```")


def test_a_body_with_backticks_gets_a_longer_fence_and_indentation_is_kept(tmp_path, monkeypatch):
    import docsgen.transcripts as transcripts

    monkeypatch.setattr(transcripts, "included", lambda path: "a\n```\nb")
    fresh = refresh("- item\n\n    <!-- specformer-include: x.md -->\n    ```\n    old\n    ```\n").text
    assert fresh == "- item\n\n    <!-- specformer-include: x.md -->\n    ````\n    a\n    ```\n    b\n    ````\n"


def test_a_missing_include_is_an_error():
    with pytest.raises(ValueError, match="no/such.txt: no such file"):
        refresh("<!-- specformer-include: no/such.txt -->")


def test_the_evaluation_page_figures_are_what_eval_computes_now(tmp_path):
    """docs/evaluation.md shows a run on the demo model; its counts depend only on the file scored and the windows."""
    import contextlib
    import io
    import json

    from specformer.cli.main import main

    page = (REPO / "docs" / "evaluation.md").read_text(encoding="utf-8")
    command = re.search(r"\$ specformer eval runs/tiny/model.safetensors --data (\S+) --context (\d+) --stride (\d+)\n", page)
    shown = re.search(r"scored\s+([\d,]+) tokens of (\d+) document\(s\) in (\d+) windows \(context (\d+), stride (\d+)\)",
                      page)
    assert command and shown, "docs/evaluation.md no longer shows the eval run this test checks"
    data, context, stride = command.groups()
    assert (context, stride) == shown.groups()[3:]
    checkpoint = tmp_path / "tiny.safetensors"
    specformer.save(specformer.build(REPO / "specs" / "tiny.yaml", seed=0), checkpoint)  # weights do not change counts
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["eval", str(checkpoint), "--data", str(REPO / data), "--context", context, "--stride", stride,
                     "--json"]) == 0
    result = json.loads(out.getvalue())
    assert (f"{result['tokens']:,}", str(result["documents"]), str(result["windows"])) == shown.groups()[:3], \
        f"docs/evaluation.md's counts have drifted from {data}: re-run the command it shows and update the page"


def test_the_pages_do_not_change_with_the_plugins_installed(toy_plugin, monkeypatch):
    """Issue 53: a user's own plugin (`pip install -e specformer-mynorm`) made `make test` fail here, its norm
    in every count and list the pages show. The pages' commands run with the built-in plugins only."""
    from specformer.registry import discovery

    monkeypatch.setenv(discovery.PLUGINS_VARIABLE, "installed")  # a user's environment: whatever is installed loads
    discovery.reset()
    assert "toy_unitnorm" in get_registry().names("norm")
    shown = [p for p in markdown_pages() if "<!-- specformer-output: " in p.read_text(encoding="utf-8")]
    assert len(shown) > 3
    for page in shown:
        text = page.read_text(encoding="utf-8")
        assert refresh(text).text == text, f"{page.relative_to(REPO)} changes with a third-party plugin installed"
    assert "toy_unitnorm" in get_registry().names("norm")  # the plugins loaded before are back


def test_the_interop_page_counts_the_families_the_hf_plugin_registers():
    """Issue 53: docs/interop.md said "nineteen" long after the hf plugin read 37 families; issue 44: out of how many."""
    from specformer_hf import get_families

    page = " ".join((REPO / "docs" / "interop.md").read_text(encoding="utf-8").split())
    said = re.search(r"for (\d+) of the (\d+) decoder-only text families of transformers (\d+\.\d+) \((\d+) model types: "
                     r"(\w+) of them are multimodal checkpoints", page)
    assert said, "docs/interop.md no longer opens with the count of families this test checks"
    # Issue 44: out of how many the installed transformers has (tests/plugins/hf/test_coverage.py checks the rows).
    transformers = pytest.importorskip("transformers")
    from specformer_hf.coverage import decoder_text_families, text_model_type

    assert (int(said[2]), said[3]) == (len(decoder_text_families()), ".".join(transformers.__version__.split(".")[:2]))
    families = [f for f in get_families() if f.plugin == "hf"]
    # A multimodal checkpoint is read for the language model of a text family already counted ("Gemma 4 (multimodal)").
    multimodal = [f for f in families if f.name.endswith(" (multimodal)")]
    decoders = {f.name for f in families} - {f.name for f in multimodal}
    assert {f.name.removesuffix(" (multimodal)") for f in multimodal} <= decoders
    # A model type saved under another name than the mapping's (coverage.SAVED_AS: emu3_text_model) is no family of
    # its own: the families are counted by the model type they stand for.
    decoders = {text_model_type(f.model_type) for f in families if f not in multimodal}
    words = {"no": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6}
    assert (int(said[1]), int(said[4]), words.get(said[5])) == (len(decoders), len(families), len(multimodal))
