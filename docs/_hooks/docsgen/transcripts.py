"""Generated blocks kept in the Markdown itself, so a page reads the same in an editor, on
the repository page and on the site.

Two markers, each on a line of its own, directly followed by a fenced code block whose
body is generated (the fence's opening line, with its language and title, is the
author's and is kept):

* ``<!-- specformer-output: summary specs/tiny.yaml -->``: the block shows the command
  and what it printed (stdout and stderr, as a terminal shows them), and its exit code
  when not 0. The command runs in-process from the repository root, so the block shows
  what this version of specformer prints, with its built-in plugins only: a page does not
  change with the third-party plugins installed where it is refreshed
  (:func:`docsgen.plugin_scope.builtin_only`).
* ``<!-- specformer-include: specs/tiny.yaml -->``: the block holds that file of the
  repository, verbatim.

``python docs/_hooks/refresh_docs.py`` (``make docs-refresh``) rewrites the blocks of
every page; ``tests/docs/test_generated_blocks.py`` fails while any block is stale. A
marker not yet followed by a block gets a ``console`` (output) or plain (include) block.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from docsgen.plugin_scope import builtin_only
from docsgen.snippets import REPO

MARKER = re.compile(r"^(?P<indent>[ \t]*)<!-- specformer-(?P<what>output|include): (?P<arg>.+?) -->[ \t]*$")
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
#: The fence language of an included file, by suffix (no language for any other file).
LANGUAGES = {".yaml": "yaml", ".yml": "yaml", ".py": "python", ".toml": "toml", ".json": "json", ".md": "markdown"}


def run_cli(args: str) -> tuple[int, str]:
    from specformer.cli.main import main

    buffer = io.StringIO()
    old = os.getcwd()
    os.chdir(REPO)
    try:
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            try:
                code = main(shlex.split(args))
            except SystemExit as exc:  # argparse's --help and usage errors
                code = int(exc.code or 0)
    finally:
        os.chdir(old)
    return code, buffer.getvalue().rstrip()


def transcript(args: str) -> tuple[int, str]:
    """The exit code of ``specformer ARGS`` and the console text showing it."""
    code, output = run_cli(args)
    lines = [f"$ specformer {args}", output] if output else [f"$ specformer {args}"]
    if code:
        lines += ["$ echo $?", str(code)]
    return code, "\n".join(lines)


def included(path: str) -> str:
    """The text of a repository file, for an include block (ValueError when there is no such file)."""
    file = REPO / path
    if not file.is_file():
        raise ValueError(f"specformer-include: {path}: no such file in the repository")
    return file.read_text(encoding="utf-8").rstrip("\n")


@dataclass
class Refreshed:
    """A page with its generated blocks brought up to date, and each command run with its exit code."""

    text: str
    ran: list[tuple[str, int]] = field(default_factory=list)


def refresh(markdown: str) -> Refreshed:
    """``markdown`` with the body of every marked block generated anew (with the built-in plugins only)."""
    with builtin_only():
        return _refresh(markdown)


def _refresh(markdown: str) -> Refreshed:
    lines = markdown.split("\n")
    out: list[str] = []
    ran: list[tuple[str, int]] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        i += 1
        marker = MARKER.match(line)
        if marker is None:
            continue
        what, arg, indent = marker["what"], marker["arg"].strip(), marker["indent"]
        if what == "output":
            code, body = transcript(arg)
            ran.append((arg, code))
        else:
            body = included(arg)
        fence = FENCE.match(lines[i]) if i < len(lines) else None
        if fence is not None:
            opening, end = lines[i], _closing_fence(lines, i, fence)
            i = end + 1  # the old body and its closing fence are replaced
        else:
            language = "console" if what == "output" else LANGUAGES.get(Path(arg).suffix, "")
            opening = f"{indent}```{language}"
        marks = FENCE.match(opening)
        assert marks is not None
        ticks = _fence_for(body, marks["fence"])
        out.append(f"{marks['indent']}{ticks}{marks['info']}")
        out.extend(indent + row if row else row for row in body.split("\n"))
        out.append(f"{marks['indent']}{ticks}")
    return Refreshed("\n".join(out), ran)


def _closing_fence(lines: list[str], start: int, opening: re.Match[str]) -> int:
    """The index of the line closing the fenced block opened at ``start``."""
    char, width = opening["fence"][0], len(opening["fence"])
    for j in range(start + 1, len(lines)):
        found = FENCE.match(lines[j])
        if found and found["fence"][0] == char and len(found["fence"]) >= width and not found["info"].strip():
            return j
    raise ValueError(f"line {start + 1}: a generated block's fence is never closed")


def _fence_for(body: str, fence: str) -> str:
    """``fence``, made longer than any run of its character in ``body`` so the body cannot close it."""
    longest = max((len(run) for run in re.findall(re.escape(fence[0]) + "{3,}", body)), default=0)
    return fence[0] * max(len(fence), longest + 1)


def markdown_pages() -> list[Path]:
    """Every Markdown page of the docs (the generated pages are not files and have no blocks)."""
    return sorted(p for p in (REPO / "docs").rglob("*.md") if "_hooks" not in p.parts)
