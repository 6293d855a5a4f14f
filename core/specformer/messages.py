"""How specformer words things for people: one function per convention, shared by every message.

- a location in a spec is written ``generate.sampler[1].k``: dots between fields,
  ``[i]`` for list indices (:func:`join_path`);
- an unknown name is followed by the closest accepted one, then the accepted ones
  (:func:`unknown_message`): ``unknown field; did you mean 'lr'? accepted: ...``;
- a count agrees with its noun (:func:`plural`): ``1 component``, ``2 components``;
- a size in bytes uses binary units with one decimal (:func:`format_bytes`):
  ``576 B``, ``36.9 KiB``, ``1.5 GiB``;
- a parse error names the line and column, never the parser's ``<unicode string>``
  (:func:`parse_error_message`);
- a docstring shown in a terminal is plain text, without reStructuredText markup
  (:func:`plain_text`).

This module imports nothing from specformer, so every other module may use it.
"""

from __future__ import annotations

import difflib
import re
from typing import Any, Iterable, Sequence


def join_path(prefix: str, loc: Iterable[Any]) -> str:
    """``prefix`` extended by ``loc``: strings become ``.field``, integers ``[i]``.

    A string part may itself be a path relative to ``prefix`` (``"[2].k"``, ``"k"``),
    as a sub-component reports its own problems.

    >>> join_path("generate", ["sampler", 1, "k"])
    'generate.sampler[1].k'
    >>> join_path("generate.sampler", [1, "[0].k"])
    'generate.sampler[1][0].k'
    """
    out = prefix
    for part in loc:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        elif str(part).startswith("[") or not out:
            out += str(part)
        elif part != "":
            out = f"{out}.{part}"
    return out


def closest(name: Any, choices: Sequence[str]) -> str | None:
    """The accepted name ``name`` was most likely meant to be, or None when none is close."""
    found = difflib.get_close_matches(str(name), list(choices), n=1)
    return found[0] if found else None


def unknown_message(what: str, name: Any, choices: Sequence[str], *, accepted: str = "accepted",
                    quote_name: bool = True) -> str:
    """``unknown <what> 'name'; did you mean 'x'? <accepted>: a, b, c``.

    ``quote_name=False`` leaves the name out where the message's location already
    shows it (a spec path ``train.lrr`` does; a component's ``kind`` value does not).
    The guess is left out when no accepted name is close.
    """
    head = f"unknown {what}" + (f" {name!r}" if quote_name else "")
    guess = closest(name, choices)
    hint = f"; did you mean {guess!r}?" if guess else ";"
    listing = ", ".join(choices) if choices else "(none)"
    return f"{head}{hint} {accepted}: {listing}"


def plural(count: int, noun: str, plural_noun: str | None = None) -> str:
    """``1 component``, ``2 components``, ``0 components`` (``plural_noun`` for irregular nouns)."""
    return f"{count:,} {noun if count == 1 else plural_noun or noun + 's'}"


_BYTE_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB")


def format_bytes(n: float) -> str:
    """A size in bytes for people: ``576 B``, ``36.9 KiB``, ``1.5 GiB`` (powers of 1024, one decimal)."""
    if abs(n) < 1024:
        return f"{int(n)} B"
    value = float(n)
    unit = "B"
    for unit in _BYTE_UNITS:
        value /= 1024
        if abs(value) < 1024 or unit == _BYTE_UNITS[-1]:
            break
    if round(abs(value), 1) >= 1024 and unit != _BYTE_UNITS[-1]:  # 1023.96 KiB would print as 1024.0 KiB
        value /= 1024
        unit = _BYTE_UNITS[_BYTE_UNITS.index(unit) + 1]
    return f"{value:.1f} {unit}"


def parse_error_message(exc: Exception, fmt: str) -> str:
    """``not valid YAML at line 4, column 1: <what the parser expected>`` for a YAML, JSON or TOML error.

    Lines and columns count from 1, as editors show them. The parser's own name for
    its input (``<unicode string>``) never appears: the caller names the file.
    """
    mark = getattr(exc, "problem_mark", None)
    if mark is not None:  # PyYAML's MarkedYAMLError: problem + where, and the construct it was inside
        where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = str(getattr(exc, "problem", "") or exc)
        context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
        inside = ""
        if context and context_mark is not None:
            inside = f" ({context} that starts at line {context_mark.line + 1}, column {context_mark.column + 1})"
        elif context:
            inside = f" ({context})"
        return f"not valid {fmt}{where}: {problem}{inside}"
    lineno, colno = getattr(exc, "lineno", None), getattr(exc, "colno", None)
    if lineno is not None and colno is not None:  # json.JSONDecodeError
        return f"not valid {fmt} at line {lineno}, column {colno}: {getattr(exc, 'msg', exc)}"
    text = " ".join(str(exc).split())
    found = re.search(r"\s*\(at line (\d+), column (\d+)\)$", text)  # tomllib puts the place at the end
    if found:
        return f"not valid {fmt} at line {found[1]}, column {found[2]}: {text[: found.start()]}"
    return f"not valid {fmt}: {text}"


_ROLE = re.compile(r":(?:[a-z]+:)+`~?([^`<]*?)(?:\s*<[^>]*>)?`")  # :class:`~a.B` -> a.B ; :func:`x <y>` -> x
_LITERAL = re.compile(r"``(.+?)``")
_LINK = re.compile(r"`([^`<]+?)\s*<[^>]+>`_{1,2}")  # `text <url>`_ -> text
_EMPHASIS = re.compile(r"(?<![\w*])\*{1,2}([^*\s][^*]*?)\*{1,2}(?![\w*])")
_CODE = re.compile(r"(`[^`\n]+`)")  # a Markdown code span: kept as written, its * are not emphasis


def plain_text(doc: str) -> str:
    """A docstring (reStructuredText) as plain text for a terminal: no ````literal````, roles or links."""

    def role(match: re.Match[str]) -> str:
        target = match[1].strip()
        return target.rsplit(".", 1)[-1] if match[0].split("`")[1].startswith("~") else target

    text = _ROLE.sub(role, doc)
    text = _LINK.sub(r"\1", text)
    text = _LITERAL.sub(r"\1", text)
    text = "".join(part if _CODE.fullmatch(part) else _EMPHASIS.sub(r"\1", part) for part in _CODE.split(text))
    return text.replace("::\n", ":\n")


__all__ = [
    "closest",
    "format_bytes",
    "join_path",
    "parse_error_message",
    "plain_text",
    "plural",
    "unknown_message",
]
