"""The component catalogue: one page per kind, generated from the live registry."""

from __future__ import annotations

import html
import re
from pathlib import Path
from urllib.parse import urlparse

from specformer.registry.discovery import plugin_infos
from specformer.registry.components import Component, Registry

from docsgen.fields import fields_table
from docsgen.snippets import REPO, ComponentSnippet, Step, component_snippet, placements
from docsgen.text import cell, first_sentence, rst_to_md

CATALOGUE_DIR = "catalogue"


#: Page titles (sidebar, page heading, index section) of the built-in plugins' kinds.
KIND_TITLES = {
    "positional": "Positional schemes",
    "norm": "Norms",
    "ffn": "Feed-forward networks",
    "mixer": "Token mixers",
    "layout": "Block layouts",
    "residual": "Residual streams",
    "per_layer_input": "Per-layer inputs",
    "adapter": "Adapters",
    "sampler": "Samplers",
    "rope_scaling": "RoPE scaling",
    "router": "Expert routers",
    "indexer": "Sparse-attention indexers",
    "activation": "Learned activations",
    "linear": "Linear projections",
    "quantization": "Quantization",
    "optimizer": "Optimizers",
    "logger": "Training loggers",
}


def kind_title(kind: str) -> str:
    """The kind's title; a kind another plugin adds is titled from its name (``my_kind``: "My kind")."""
    return KIND_TITLES.get(kind) or kind.replace("_", " ").capitalize()


def kind_page(kind: str) -> str:
    return f"{CATALOGUE_DIR}/{kind}.md"


def anchor(component: Component) -> str:
    return component.name


def kinds_with_components(registry: Registry) -> list[str]:
    """Kinds in the order the core lists them, then plugin-added ones; only those with components."""
    return [k for k in registry.kinds if registry.names(k)]


def paper_label(url: str) -> str:
    match = re.search(r"arxiv\.org/(?:abs|pdf)/([\w.\-/]+?)(?:v\d+)?(?:\.pdf)?$", url)
    if match:
        return f"arXiv:{match.group(1)}"
    parsed = urlparse(url)
    name = Path(parsed.path).name or parsed.netloc
    return f"{parsed.netloc}: {name}" if name != parsed.netloc else parsed.netloc


def source_label(component: Component) -> str:
    """``plugins/specformer_layers/norms/rmsnorm.py:13`` for code in this repository, else the module."""
    match = re.match(r"(?P<module>\S+) \((?P<file>.+):(?P<line>\d+)\)$", component.source)
    if not match:
        return component.source
    file = Path(match["file"])
    try:
        return f"{file.resolve().relative_to(REPO)}:{match['line']}"
    except ValueError:
        return f"{match['module']}:{match['line']}"


def spec_path(path: list[Step]) -> str:
    out = ""
    for step in path:
        if step[0] == "key":
            out = f"{out}.{step[1]}" if out else step[1]
        elif step[0] == "item":
            out += "[]"
        else:
            out += f" (in {step[2]})"
    return out


def _link_kind(pages: set[str]):
    """How a params table names a sub-component's kind: a link to that kind's page when it has one."""

    def link(kind: str) -> str:
        return f"a [{kind}]({kind}.md) component" if kind in pages else f"a `{kind}` component"

    return link


def _no_def(name: str) -> str:
    return f"`{name}`"


def _indent(text: str, by: str = "    ") -> str:
    return "\n".join(by + line if line.strip() else line for line in text.splitlines())


def _meta_line(component: Component, distributions: dict[str, str]) -> str:
    """Plugin, paper and source as one muted line (raw HTML: it carries a CSS class)."""
    plugin = f"plugin <strong><code>{html.escape(component.plugin)}</code></strong>"
    if component.plugin in distributions:
        plugin += f" ({html.escape(distributions[component.plugin])})"
    parts = [plugin]
    if component.paper:
        parts.append(f'paper <a href="{html.escape(component.paper)}">{html.escape(paper_label(component.paper))}</a>')
    parts.append(f"source <code>{html.escape(source_label(component))}</code>")
    return '<p class="sf-meta">' + " · ".join(parts) + "</p>"


def component_section(component: Component, registry: Registry, paths: dict[str, list[Step]],
                      distributions: dict[str, str], pages: set[str]) -> tuple[str, list[ComponentSnippet]]:
    """The Markdown for one component, and the snippets it shows (for validation)."""
    schema = component.params.model_json_schema(ref_template="#/$defs/{model}")
    parts = [
        f"## {component.name} {{ #{anchor(component)} }}",
        "",
        _meta_line(component, distributions),
        "",
        rst_to_md(component.doc) or "_No description._",
        "",
        f"**Params** (`{component.params.__qualname__.replace('.<locals>', '')}`)",
        "",
        fields_table(component.params, schema, link_kind=_link_kind(pages), link_def=_no_def),
    ]
    if component.kind not in paths:
        # A kind a plugin uses from Python only: no spec field takes it, so there is no snippet to show.
        parts += [f"_No spec field takes a `{component.kind}` component; the plugin that added the kind uses it from Python._", ""]
        return "\n".join(parts), []
    minimal = component_snippet(component, registry, paths)
    full = component_snippet(component, registry, paths, full=True)
    parts += ["**Smallest spec that uses it**", "", "```yaml", minimal.yaml, "```", ""]
    if component.params.model_fields:
        parts += [
            '??? example "Every param written out, at its default"',
            "",
            _indent("```yaml\n" + full.yaml + "\n```"),
            "",
        ]
    return "\n".join(parts), [minimal, full]


def catalogue_pages(registry: Registry) -> tuple[dict[str, str], dict[str, list[ComponentSnippet]]]:
    """Every catalogue page (path -> Markdown), and each component's snippets keyed ``kind/name``."""
    paths = placements(registry)
    distributions = {info.name: f"{info.distribution} {info.version}".strip() for info in plugin_infos()}
    pages: dict[str, str] = {}
    snippets: dict[str, list[ComponentSnippet]] = {}
    kinds = kinds_with_components(registry)
    for kind in kinds:
        spec = registry.kinds[kind]
        components = [c for c in registry if c.kind == kind]
        where = f"`{spec_path(paths[kind])}`" if kind in paths else "no spec field (used from Python)"
        if spec.sizes:
            call = f"`factory(params, *, {', '.join(spec.sizes)})`, passing the sizes only the builder knows"
        else:
            call = "`factory(params)`"
        lines = [
            f"# {kind_title(kind)}",
            "",
            f'<p class="sf-meta">components of kind <code>{kind}</code></p>',
            "",
            rst_to_md(spec.doc),
            "",
            f"Written in a spec at {where}. Each one is made with {call}.",
            "",
            "| Name | Plugin | What it is |",
            "| --- | --- | --- |",
        ]
        for c in components:
            lines.append(f"| [`{c.name}`](#{anchor(c)}) | `{c.plugin}` | {cell(rst_to_md(c.summary))} |")
        lines.append("")
        for c in components:
            section, shown = component_section(c, registry, paths, distributions, set(kinds))
            lines += [section, ""]
            snippets[f"{kind}/{c.name}"] = shown
        pages[kind_page(kind)] = "\n".join(lines)

    total = len(registry)
    index = [
        "# Component catalogue",
        "",
        f"Every component registered right now: **{total}** components of **{len(kinds)}** kinds, from "
        f"{len({c.plugin for c in registry})} plugins. This page is generated from the live registry each "
        "time the site is built, so it lists exactly what `specformer components` lists for specformer's "
        "built-in plugins. To see your own plugin's components here too, build the site with every "
        "installed plugin: `SPECFORMER_DOCS_PLUGINS=installed mkdocs serve`.",
        "",
        "Each entry shows the registering plugin, the paper, every param with its type, default and meaning, "
        "and the smallest spec fragment that uses it (checked against the registry at build time). "
        "See [Writing specs](../writing-specs.md) for how fragments fit into a whole spec.",
        "",
        "| Kind | Components | What it is |",
        "| --- | --- | --- |",
    ]
    for kind in kinds:
        names = ", ".join(f"[`{n}`]({kind}.md#{n})" for n in registry.names(kind))
        index.append(f"| [`{kind}`]({kind}.md) | {names} | {cell(first_sentence(registry.kinds[kind].doc))} |")
    empty = [k for k in registry.kinds if k not in kinds]
    if empty:
        index += ["", "Kinds with no component registered yet: " + ", ".join(f"`{k}`" for k in empty) + "."]
    index += ["", "## All components", ""]
    for kind in kinds:
        index += [f"### {kind_title(kind)}", "", "| Component | Plugin | What it is |", "| --- | --- | --- |"]
        for c in (c for c in registry if c.kind == kind):
            index.append(f"| [`{c.name}`]({kind}.md#{anchor(c)}) | `{c.plugin}` | {cell(rst_to_md(c.summary))} |")
        index.append("")
    pages[f"{CATALOGUE_DIR}/index.md"] = "\n".join(index) + "\n"
    return pages, snippets
