"""Every generated page, and the navigation entries that depend on what is registered."""

from __future__ import annotations

from dataclasses import dataclass, field

from specformer.registry.discovery import get_registry
from specformer.registry.components import Registry

from docsgen.api_ref import api_modules, api_page_path, api_pages
from docsgen.catalogue import CATALOGUE_DIR, catalogue_pages, kind_page, kind_title, kinds_with_components
from docsgen.cli_ref import cli_page
from docsgen.hooks_ref import hooks_page
from docsgen.snippets import ComponentSnippet, forget_files
from docsgen.spec_ref import spec_reference_page


@dataclass
class Generated:
    pages: dict[str, str]
    snippets: dict[str, list[ComponentSnippet]] = field(default_factory=dict)

    def snippet_errors(self) -> list[str]:
        return [f"{key}: {s.error}" for key, shown in self.snippets.items() for s in shown if s.error]


def generate(registry: Registry | None = None) -> Generated:
    registry = registry or get_registry()
    forget_files()
    catalogue, snippets = catalogue_pages(registry)
    pages = {
        **catalogue,
        "reference/spec.md": spec_reference_page(registry, catalogue_kinds=set(kinds_with_components(registry))),
        "reference/hooks.md": hooks_page(),
        "reference/cli.md": cli_page(),
        **api_pages(),
    }
    return Generated(pages, snippets)


def catalogue_nav(registry: Registry | None = None) -> list:
    registry = registry or get_registry()
    return [f"{CATALOGUE_DIR}/index.md"] + [{kind_title(k): kind_page(k)} for k in kinds_with_components(registry)]


def api_nav() -> list:
    return ["api/index.md"] + [{m: api_page_path(m)} for m in api_modules()]
