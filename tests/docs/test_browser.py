"""The built site in a real browser: the catalogue renders and the site search finds a component.

Uses Debian's ``chromium`` package (``apt-get install chromium``) headless, over the
DevTools protocol; the site is served on 127.0.0.1 only. Screenshots are written to
``artifacts/docs/`` (git-ignored) for people to look at.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from docs_browser import CHROMIUM, Browser, serve
from docs_site import ARTIFACTS
from specformer.registry.discovery import get_registry

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason=f"{CHROMIUM} is not installed (Debian: apt-get install chromium); the browser checks of the docs site need it",
)


@pytest.fixture(scope="module")
def browser():
    b = Browser(width=1400, height=1000)
    try:
        yield b
    finally:
        b.close()


@pytest.fixture(scope="module")
def site_url(built_site: Path):
    with serve(built_site) as url:
        yield url


def _searchable_component():
    """A component whose name is distinctive enough to be a search query: the longest norm, say."""
    registry = get_registry()
    norms = [c for c in registry if c.kind == "norm"]
    return max(norms or list(registry), key=lambda c: (len(c.name), c.name))


def test_catalogue_page_renders_every_component(browser, site_url):
    registry = get_registry()
    component = _searchable_component()
    browser.goto(f"{site_url}catalogue/{component.kind}/")
    title = browser.evaluate("document.querySelector('article h1').textContent")
    assert title.strip().rstrip("¶").strip(), "the catalogue page has no title"
    headings = browser.evaluate("[...document.querySelectorAll('article h2[id]')].map(h => h.id)")
    assert set(registry.names(component.kind)) <= set(headings), headings
    # The stylesheet loaded and the params tables were laid out (not raw Markdown).
    tables = browser.evaluate("document.querySelectorAll('article table').length")
    assert tables >= 1 + sum(1 for c in registry if c.kind == component.kind and c.params.model_fields)
    assert browser.evaluate("getComputedStyle(document.querySelector('.sf-meta')).fontSize") != ""
    shot = browser.screenshot(ARTIFACTS / f"catalogue-{component.kind}.png", full_page=True)
    assert shot.stat().st_size > 10_000


def test_search_finds_a_component(browser, site_url):
    component = _searchable_component()
    browser.goto(f"{site_url}catalogue/")
    browser.evaluate("document.querySelector('input.md-search__input').focus()")
    browser.type_text(component.name)
    links = browser.wait_for(
        "[...document.querySelectorAll('.md-search-result__item a')].map(a => a.getAttribute('href'))", timeout=30
    )
    target = f"catalogue/{component.kind}/"
    assert any(target in link and f"#{component.name}" in link for link in links), (component.name, links)
    browser.screenshot(ARTIFACTS / "search.png")


def test_concepts_diagram_is_drawn_without_scripts(browser, site_url):
    browser.goto(f"{site_url}concepts/")
    boxes = browser.evaluate(
        "[...document.querySelectorAll('.sf-flow .sf-box')].map(b => [b.getBoundingClientRect().width, "
        "getComputedStyle(b).borderTopStyle])"
    )
    assert len(boxes) >= 6 and all(width > 50 and style in ("solid", "dashed") for width, style in boxes), boxes
    browser.screenshot(ARTIFACTS / "concepts.png")
