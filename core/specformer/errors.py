"""Exceptions that describe a user's mistake.

Every error a person can cause (a bad spec, a bad flag, a bad file) derives from
:class:`UserError`. The CLI prints its message and exits with code 2, with no
traceback; anything else is a bug in specformer or a plugin and keeps its traceback.
"""

from __future__ import annotations

from dataclasses import dataclass


class UserError(Exception):
    """A mistake in what the user gave us; the message says what and what is accepted."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a spec, located by its dotted path (``model.block.attention.n_heads``)."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class SpecError(UserError, ValueError):
    """A spec that does not validate; carries every problem found, one per line."""

    def __init__(self, problems: list[Problem], *, source: str | None = None) -> None:
        self.problems = list(problems)
        self.source = source
        head = f"{source}: " if source else ""
        noun = "problem" if len(self.problems) == 1 else "problems"
        lines = [f"{head}{len(self.problems)} {noun} in the spec:"]
        lines += [f"  {p}" for p in self.problems]
        super().__init__("\n".join(lines))


class RegistryError(Exception):
    """A plugin registered something invalid (a programming error of the plugin's author)."""


class UnknownComponentError(UserError, KeyError):
    """A spec named a component that is not registered."""

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


class CheckpointError(UserError):
    """A checkpoint file that is missing, corrupt, or does not match its spec."""
