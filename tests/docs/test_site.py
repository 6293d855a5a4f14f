"""The built site says what the code does: every component, hook, command, spec field and module is on it."""

from __future__ import annotations

import html
import importlib.metadata
import inspect
import json
import os
import re
from pathlib import Path

import pytest

import docsgen.transcripts
from docs_site import REPO, page_html, visible_text
from docsgen.api_ref import api_modules, api_page_path
from docsgen.catalogue import kind_page, paper_label
from docsgen.hooks_ref import hooks, plugin_hooks
from specformer.registry import hookspecs
from specformer.cli.main import make_parser
from specformer.errors import SpecError
from specformer.registry.discovery import get_registry
from specformer.spec import BlockSpec, LayerOverride, ModelSpec, load_spec

pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")
import specformer_docs  # noqa: E402  (the mkdocs hook module: it imports mkdocs)


def test_strict_build_writes_every_page(built_site: Path):
    for page in ["index.md", "getting-started.md", "concepts.md", "writing-specs.md", "writing-a-plugin.md",
                 "catalogue/index.md", "reference/spec.md", "reference/hooks.md", "reference/cli.md", "api/index.md"]:
        assert "<h1" in page_html(built_site, page), page
    assert (built_site / "search" / "search_index.json").is_file()


def test_every_registered_component_is_in_the_catalogue(built_site: Path):
    registry = get_registry()
    assert len(registry) > 0
    index = page_html(built_site, "catalogue/index.md")
    for component in registry:
        page = page_html(built_site, kind_page(component.kind))
        where = f"{component.kind} {component.name!r} of plugin {component.plugin!r}"
        section = _section(page, component.name)
        assert section, f"{where} has no section on {kind_page(component.kind)}"
        text = visible_text(section)
        assert component.plugin in text, where
        for param in component.params.model_fields:
            assert f"<code>{param}</code>" in section, f"{where}: param {param!r} missing from its table"
        if component.paper:
            assert f'href="{html.escape(component.paper)}"' in section, f"{where}: paper link missing"
            assert paper_label(component.paper) in text
        assert f'href="{component.kind}/#{component.name}"' in index, f"{where} is not linked from the catalogue index"


def test_every_component_doc_line_is_shown(built_site: Path):
    registry = get_registry()
    for component in registry:
        summary_words = re.findall(r"[A-Za-z]{4,}", component.summary)[:6]
        text = visible_text(_section(page_html(built_site, kind_page(component.kind)), component.name))
        for word in summary_words:
            assert word in text, f"{component.kind} {component.name}: doc word {word!r} not on the page"


def _section(page: str, anchor: str) -> str:
    """The HTML from the heading with id ``anchor`` to the next heading of the same level."""
    match = re.search(rf'<h2 id="{re.escape(anchor)}"', page)
    if not match:
        return ""
    end = page.find("<h2 ", match.end())
    return page[match.start(): end if end != -1 else len(page)]


def test_every_hook_is_in_the_hooks_reference(built_site: Path):
    page = page_html(built_site, "reference/hooks.md")
    specs = [name for name, f in vars(hookspecs).items() if callable(f) and hasattr(f, f"{hookspecs.PROJECT}_spec")]
    assert {h.name for h in hooks()} == set(specs)
    for name in specs:
        section = _section(page, name)
        assert section, f"hook {name} missing from the hooks reference"
        function = getattr(hookspecs, name)
        for param in inspect.signature(function).parameters:
            assert f"<code>{param}</code>" in section, f"{name}: parameter {param} missing"
        firstresult = getattr(function, f"{hookspecs.PROJECT}_spec")["firstresult"]
        assert ("firstresult: yes" if firstresult else "firstresult: no") in visible_text(section), name
        first_line = (function.__doc__ or "").strip().splitlines()[0]
        assert re.findall(r"[A-Za-z]{5,}", first_line)[0] in visible_text(section)


def test_hooks_that_plugins_define_are_in_the_hooks_reference(built_site: Path):
    page = page_html(built_site, "reference/hooks.md")
    for plugin, _module, found in plugin_hooks():
        assert f'id="plugin-{plugin}"' in page, f"no section for the hooks of plugin {plugin}"
        for h in found:
            assert f'<h3 id="{h.name}"' in page, f"hook {h.name} of plugin {plugin} missing from the hooks reference"


def test_every_cli_command_and_argument_is_in_the_cli_reference(built_site: Path):
    page = page_html(built_site, "reference/cli.md")
    parser, commands = make_parser()
    subs = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices
    assert "new-plugin" in subs
    for name, sub in subs.items():
        section = _section(page, name)
        assert section, f"command {name} missing from the CLI reference"
        assert commands.by_name[name].plugin in visible_text(section)
        for action in sub._actions:
            if action.help == "==SUPPRESS==" or action.__class__.__name__ in ("_HelpAction", "_SubParsersAction"):
                continue
            label = action.option_strings[0] if action.option_strings else (action.metavar or action.dest)
            assert html.escape(label) in section, f"{name}: argument {label} missing"


def test_every_spec_field_and_section_is_in_the_spec_reference(built_site: Path):
    page = page_html(built_site, "reference/spec.md")
    for model in (ModelSpec, BlockSpec, LayerOverride):
        for field in model.model_fields:
            assert f"<code>{field}</code>" in page, f"{model.__name__}.{field} missing from the spec reference"
    for name, (model, plugin) in get_registry().sections.items():
        section = _section(page, name)
        assert section, f"section {name!r} of plugin {plugin!r} missing from the spec reference"
        for field in model.model_fields:
            assert f"<code>{field}</code>" in section, f"{name}.{field} missing from the spec reference"


def test_every_core_module_has_an_api_page(built_site: Path):
    import specformer

    modules = api_modules()
    assert "specformer.registry.components" in modules and "specformer.cli.scaffold" in modules
    for module in modules:
        page = page_html(built_site, api_page_path(module))
        assert "doc doc-" in page, f"{module}: mkdocstrings rendered nothing"
        text = visible_text(page)
        for leftover in (":class:`", ":func:`", ":meth:`", ":data:`", "``"):
            assert leftover not in text, f"{module}: reStructuredText {leftover!r} left in the rendered docstrings"
        assert "<p>::</p>" not in page, f"{module}: a literal block marker was not turned into code"
    index = page_html(built_site, "api/index.md")
    for name in ("build", "load_spec", "save", "load", "Decoder", "SpecError"):
        obj = getattr(specformer, name)
        assert f'id="{obj.__module__}.{obj.__qualname__}"' in page_html(built_site, api_page_path(obj.__module__))
        assert f"specformer.{name}" in visible_text(index)


def test_transcripts_show_what_the_cli_prints_now(built_site: Path):
    text = visible_text(page_html(built_site, "writing-specs.md"))
    for name in ("mistakes", "bad-sizes", "bad-layers"):
        path = f"docs/snippets/{name}.yaml"
        with pytest.raises(SpecError) as info:
            load_spec(REPO / path)
        for problem in info.value.problems:
            assert str(problem) in text, f"{path}: the page does not show the problem {problem}"
    summary = visible_text(page_html(built_site, "getting-started.md"))
    code, output = docsgen.transcripts.run_cli("summary specs/tiny.yaml")
    assert code == 0 and " ".join(output.split()) in summary


def test_nav_lists_pages_of_other_work_streams_only_once_they_exist(tmp_path):
    (tmp_path / "training.md").write_text("# Training\n")
    nav = [{"Home": "index.md"}, {"Training": "training.md"}, {"Interop": "interop.md"},
           {"Benchmarks": "benchmarks.md"}, {"Ref": [{"Hooks": "reference/hooks.md"}]}]
    fitted = specformer_docs._fit_nav(nav, tmp_path)
    assert fitted == [{"Home": "index.md"}, {"Training": "training.md"}, {"Ref": [{"Hooks": "reference/hooks.md"}]}]
    assert specformer_docs.OPTIONAL_PAGES == {"generation.md", "training.md", "interop.md", "components-guide.md", "benchmarks.md"}


def test_every_catalogue_page_in_the_sidebar_has_a_title_not_a_kind_name():
    """Issue 53: the sidebar listed "Norms" beside "rope_scaling" and "per_layer_input"."""
    from docsgen.catalogue import KIND_TITLES, kind_title
    from docsgen.pages import catalogue_nav

    entries = [entry for entry in catalogue_nav() if isinstance(entry, dict)]
    assert len(entries) >= 10
    for entry in entries:
        (title, page), = entry.items()
        kind = Path(page).stem
        assert title == KIND_TITLES.get(kind), f"built-in kind {kind!r} has no title in docsgen.catalogue.KIND_TITLES"
        assert title[0].isupper() and "_" not in title, title
    assert kind_title("my_new_kind") == "My new kind"  # a kind a plugin adds: titled from its name


def test_site_nav_matches_the_docs_folder(built_site: Path):
    nav = page_html(built_site, "index.md")
    for page in sorted(specformer_docs.OPTIONAL_PAGES):
        exists = (REPO / "docs" / page).is_file()
        linked = f'href="{page.removesuffix(".md")}/"' in nav
        assert linked == exists, f"docs/{page} {'exists' if exists else 'does not exist'} but the nav {'links' if linked else 'omits'} it"
    for kind in {c.kind for c in get_registry()}:
        assert f'href="catalogue/{kind}/"' in nav, f"no nav entry for the {kind} catalogue page"


def test_search_index_has_every_component_heading(built_site: Path):
    index = json.loads((built_site / "search" / "search_index.json").read_text())
    locations = {doc["location"] for doc in index["docs"]}
    for component in get_registry():
        assert f"catalogue/{component.kind}/#{component.name}" in locations, f"{component.name} not in the search index"


def test_a_plain_build_prints_no_banner_and_no_warning(site_build):
    """`mkdocs build` as a user types it: mkdocs.yml silences the theme's banner, nothing is warned."""
    _, output = site_build
    assert "NO_MKDOCS_2_WARNING" not in output and "end of life" not in output, output
    assert "WARNING" not in output, output


def test_the_site_documents_the_built_in_plugins_only(built_site: Path):
    from docsgen.plugin_scope import BUILTIN_DISTRIBUTION

    built_in = {ep.name for ep in importlib.metadata.entry_points(group="specformer")
                if ep.dist is not None and ep.dist.name == BUILTIN_DISTRIBUTION}
    assert built_in >= {"layers", "generate", "train", "hf"}
    named = set()
    for page in (built_site / "catalogue").glob("*/index.html"):
        named |= set(re.findall(r"plugin <strong><code>(\w+)</code>", page.read_text(encoding="utf-8")))
    assert named and named <= built_in, named


def test_the_plugin_scope_is_checked_and_narrows_the_registry(toy_plugin, monkeypatch):
    from docsgen.plugin_scope import load_plugins
    from specformer.registry.discovery import PLUGINS_VARIABLE

    # load_plugins chooses the plugins for the rest of the process: the test's selection is put back after it.
    monkeypatch.setenv(PLUGINS_VARIABLE, os.environ[PLUGINS_VARIABLE])
    assert "toy" in load_plugins("installed")
    assert get_registry().get("norm", "toy_unitnorm").plugin == "toy"
    documented = load_plugins("builtin")
    assert "toy" not in documented and {"layers", "generate", "train", "hf"} <= set(documented)
    assert "toy_unitnorm" not in get_registry().names("norm")
    assert "toy" in {ep.name for ep in importlib.metadata.entry_points(group="specformer")}  # still installed
    with pytest.raises(ValueError, match="SPECFORMER_DOCS_PLUGINS is 'all'; accepted: builtin, installed"):
        load_plugins("all")
