"""Exceptions that describe a user's mistake.

Every error a person can cause (a bad spec, a bad flag, a bad file) derives from
:class:`UserError`. The CLI prints its message and exits with code 2, with no
traceback; anything else is a bug in specformer or a plugin and keeps its traceback.
"""

from __future__ import annotations

import reprlib
from dataclasses import dataclass
from typing import Any, Sequence

#: Longest excerpt of a user's value quoted in a message (characters).
EXCERPT_CHARS = 80
#: Longest path shown in a problem (its keys are the user's: a misspelt key may be a 4 MB string).
PATH_CHARS = 200
#: Longest message of a problem: a safety net for messages that quote user text unbounded. It is far above
#: the longest list of accepted names (train's ~60 fields), which a message must show whole.
MESSAGE_CHARS = 4000
#: Most problems a SpecError's message lists (``.problems`` keeps them all).
MAX_PROBLEMS_SHOWN = 50


def excerpt(value: Any, limit: int = EXCERPT_CHARS) -> str:
    """A short ``repr`` of a value a user gave, bounded in length and in the work it takes.

    A value may be huge (a 4 MB string) or a YAML alias bomb sharing its parts, so the
    repr is made by :mod:`reprlib` (which looks at a few items per level) and cut.
    """
    r = reprlib.Repr()
    r.maxlevel, r.maxdict, r.maxlist, r.maxtuple, r.maxset = 3, 4, 4, 4, 4
    r.maxstring = r.maxother = r.maxlong = limit
    try:
        text = r.repr(value)
    except Exception:  # noqa: BLE001 - e.g. an int too long to print; the type still helps
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 1] + "…"


class UserError(Exception):
    """A mistake in what the user gave us; the message says what and what is accepted."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a spec, located by its dotted path (``model.block.mixer.n_heads``)."""

    path: str
    message: str

    def __str__(self) -> str:
        message = _cut(self.message, MESSAGE_CHARS)
        return f"{_cut(self.path, PATH_CHARS)}: {message}" if self.path else message


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def problems_line(problems: Sequence[Problem]) -> str:
    """Problems on one line, ``adapter.rank: ...; adapter.alpha: ...``, for a message that names its file first.

    A checkpoint's header or a flag carries a component outside any spec; its problems
    are worded as a spec's are (:func:`specformer.spec.problems_from_validation_error`)
    but belong inside one sentence, not under a "problems in the spec" heading.
    """
    shown = "; ".join(map(str, problems[:MAX_PROBLEMS_SHOWN]))
    more = len(problems) - MAX_PROBLEMS_SHOWN
    return shown + (f"; ... and {more:,} more" if more > 0 else "")


class SpecError(UserError, ValueError):
    """A spec that does not validate; carries every problem found, one per line."""

    def __init__(self, problems: list[Problem], *, source: str | None = None, not_checked: Sequence[str] = ()) -> None:
        """``not_checked`` names the checks these problems made meaningless, said once after them."""
        self.problems = list(problems)
        self.source = source
        self.not_checked = tuple(not_checked)
        head = f"{source}: " if source else ""
        noun = "problem" if len(self.problems) == 1 else "problems"
        lines = [f"{head}{len(self.problems):,} {noun} in the spec:"]
        lines += [f"  {p}" for p in self.problems[:MAX_PROBLEMS_SHOWN]]
        if len(self.problems) > MAX_PROBLEMS_SHOWN:
            # A generated file can hold 100,000 mistakes; the first ones say what is wrong.
            lines.append(f"  ... and {len(self.problems) - MAX_PROBLEMS_SHOWN:,} more")
        if self.not_checked:
            lines.append(f"  (checked once these are fixed: {', '.join(self.not_checked)})")
        super().__init__("\n".join(lines))


class RegistryError(Exception):
    """A plugin registered something invalid (a programming error of the plugin's author)."""


class UnknownComponentError(UserError, KeyError):
    """A spec named a component that is not registered."""

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


class InputError(UserError, ValueError):
    """A file or value we were given that is malformed or exceeds a safety bound (the message names it)."""


class MemoryLimitError(UserError, MemoryError):
    """Building or loading a model would need more memory than is available (the message says how to override)."""


class CheckpointError(UserError, ValueError):
    """A checkpoint file that is missing, corrupt, or does not match its spec."""
