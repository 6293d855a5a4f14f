"""Docstrings (reStructuredText habits) become Markdown the API pages can render."""

from __future__ import annotations

from docs_site import HOOKS  # noqa: F401  (puts the docs generators on sys.path)
from docsgen.text import rst_to_md


def test_a_doctest_is_fenced_so_its_output_is_not_read_as_markdown():
    doc = '''Join a path.

    >>> join_path("generate.sampler", [1, "[0].k"])
    'generate.sampler[1][0].k'

    After.
    '''
    md = rst_to_md(doc)
    assert '```pycon\n>>> join_path("generate.sampler", [1, "[0].k"])\n\'generate.sampler[1][0].k\'\n```' in md
    assert md.startswith("Join a path.") and md.rstrip().endswith("After.")


def test_roles_double_backticks_and_literal_blocks():
    md = rst_to_md("Raises :class:`~specformer.errors.UserError` for ``x``.\n\n    Example::\n\n        a = 1\n")
    assert '<autoref identifier="specformer.errors.UserError" optional><code>UserError</code></autoref>' in md
    assert "for `x`." in md and "``x``" not in md
    assert "Example:\n\n```python\na = 1\n```" in md and "::" not in md
    assert rst_to_md("Not a block::\nnext line") == "Not a block::\nnext line"  # nothing indented: left as is
