"""Paths and small readers shared by the docs tests."""

from __future__ import annotations

import html
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HOOKS = REPO / "docs" / "_hooks"
ARTIFACTS = REPO / "artifacts" / "docs"

# The generators the mkdocs hook uses, imported by the tests to compare against the site.
if str(HOOKS) not in sys.path:
    sys.path.insert(0, str(HOOKS))


def page_html(site: Path, page: str) -> str:
    """The HTML mkdocs wrote for ``page`` (a docs path such as ``catalogue/norm.md``)."""
    stem = page.removesuffix(".md")
    if stem == "index":
        path = site / "index.html"
    elif stem.endswith("/index"):
        path = site / stem.removesuffix("/index") / "index.html"
    else:
        path = site / stem / "index.html"
    assert path.is_file(), f"the site has no page for {page} (looked for {path})"
    return path.read_text(encoding="utf-8")


def visible_text(page: str) -> str:
    """The page's text without tags, entities decoded, whitespace collapsed."""
    text = re.sub(r"<script.*?</script>|<style.*?</style>", " ", page, flags=re.S)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", text)).split())
