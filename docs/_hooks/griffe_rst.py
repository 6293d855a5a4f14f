"""griffe extension: read the core's reStructuredText habits as Markdown in the API pages.

``:class:`~specformer.errors.UserError``` becomes a link, ````code```` becomes `code`,
and a ``Text::`` paragraph followed by an indented block becomes a fenced code block.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import griffe

sys.path.insert(0, str(Path(__file__).resolve().parent))

from docsgen.text import rst_to_md  # noqa: E402


class RstToMarkdown(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        _convert(obj)

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        _convert(pkg)  # the root package is not always passed to on_instance


def _convert(obj: griffe.Object) -> None:
    # Idempotent: a converted docstring has no roles, double backticks or "::" left.
    if obj.docstring is not None and obj.docstring.value:
        module = obj.path if obj.is_module else obj.module.path
        obj.docstring.value = rst_to_md(obj.docstring.value, module=module)
