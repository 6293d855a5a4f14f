"""Turning the code's docstrings (reStructuredText habits) into Markdown for the site."""

from __future__ import annotations

import inspect
import re

_ROLE = re.compile(r":(?:class|func|meth|data|attr|mod|exc|obj):`(~?)([^`<]+?)`")
_DOUBLE_TICKS = re.compile(r"``(.+?)``")


def autoref(identifier: str, title: str) -> str:
    """A link to ``identifier`` in the API pages, or plain code when it is not documented there.

    mkdocs-autorefs resolves it after all pages are rendered; ``optional`` keeps an
    unknown identifier from failing a strict build (it renders as plain code instead).
    """
    return f'<autoref identifier="{identifier}" optional><code>{title}</code></autoref>'


def rst_to_md(text: str, *, module: str | None = None) -> str:
    """Docstring text to Markdown: roles become API links, ``::`` blocks become fenced code."""
    text = inspect.cleandoc(text or "")

    def role(match: re.Match[str]) -> str:
        short, target = match.group(1), match.group(2).strip()
        title = target.rsplit(".", 1)[-1] if short else target
        if target.startswith("specformer"):
            return autoref(target, title)
        if "." not in target and module is not None:
            return autoref(f"{module}.{target}", title)
        return f"`{title}`"

    text = _ROLE.sub(role, text)
    text = _DOUBLE_TICKS.sub(lambda m: f"`{m.group(1)}`", text)
    return _literal_blocks(_doctest_blocks(text))


def _doctest_blocks(text: str) -> str:
    """``>>>`` lines with the output below them (up to a blank line) are code: fence them as ``pycon``.

    Left as prose, an output such as ``'a[1][0]'`` reads as a Markdown reference link.
    """
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        if not lines[i].lstrip().startswith(">>>"):
            out.append(lines[i])
            i += 1
            continue
        indent = len(lines[i]) - len(lines[i].lstrip())
        block: list[str] = []
        while i < len(lines) and lines[i].strip():
            block.append(lines[i][indent:])
            i += 1
        out += ["", "```pycon", *block, "```", ""]
    return "\n".join(out)


def _literal_blocks(text: str) -> str:
    """``Paragraph::`` followed by an indented block is code; fence it (``toml`` for pyproject)."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.rstrip().endswith("::") and not line.strip().startswith((">>>", "#")):
            lead = line.rstrip()[:-2].rstrip()
            j = i + 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            block: list[str] = []
            base = len(lines[j]) - len(lines[j].lstrip()) if j < len(lines) else 0
            while j < len(lines) and (not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) >= base > 0):
                block.append(lines[j][base:])
                j += 1
            while block and not block[-1].strip():
                block.pop()
            if block and base > 0:
                # "Text::" shows as "Text:"; a lone "::" disappears.
                out.append(lead + ":" if lead and not lead.endswith(":") else lead)
                language = "toml" if any(b.lstrip().startswith("[") for b in block[:1]) else "python"
                out += ["", f"```{language}", *block, "```", ""]
                i = j
                continue
        out.append(line)
        i += 1
    return "\n".join(out)


def first_sentence(text: str) -> str:
    """The summary line of a docstring, as Markdown."""
    para = inspect.cleandoc(text or "").split("\n\n", 1)[0]
    return " ".join(para.split())


def cell(text: str) -> str:
    """Text that is safe inside a Markdown table cell: pipes escaped, except inside code spans.

    (Python-Markdown's tables already ignore pipes inside backticks, and an escape there
    would show.)
    """
    parts = re.split(r"(`[^`]*`)", " ".join(str(text).split()))
    return "".join(p if p.startswith("`") else p.replace("|", "\\|") for p in parts)


def slug(text: str) -> str:
    """The anchor python-markdown's toc gives a heading made of ``text`` (letters, digits, '-', '_')."""
    return re.sub(r"[^\w\- ]", "", text).strip().lower().replace(" ", "-")
