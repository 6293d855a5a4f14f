"""Why no Hugging Face family can express a spec: one line by default, each family's reasons on demand.

Every family stops at the first part of the spec it has no counterpart for (or, when its config
reads back different, lists the parts that differ), so the line names the part the most
families lack and the families that lack the fewest parts, in the registry's order; a family
that only exports through another (a multimodal checkpoint's, which writes its text family)
is no reason and is left out. ``details`` (``hf export --verbose``) holds every family's reason.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from specformer.errors import UserError

from specformer_hf.family import Family
from specformer_hf.specview import NotExpressible

#: How many of the closest families the line names.
CLOSEST = 3
#: Longest value (as written in the spec) the line quotes beside a part's path.
SHORT_VALUE = 40


class NoFamily(UserError):
    """No family expresses the spec: ``str()`` is one line; ``details`` each family's reason, one a line."""

    def __init__(self, summary: str, *, details: Sequence[str]) -> None:
        self.summary = summary
        self.details = list(details)
        super().__init__(f"{summary}; each family's reason: --verbose")

    def verbose(self) -> str:
        return "\n".join([f"{self.summary}; each family's reason:", *(f"  {line}" for line in self.details)])


def no_family(refused: Sequence[tuple[Family, NotExpressible]], spec: dict[str, Any]) -> NoFamily:
    """The refusal for ``refused`` (each family tried, in order, with why it cannot express ``spec``, a spec dict)."""
    details = [f"{family.name} ({family.model_type}): {exc}" for family, exc in refused]
    lacking = [(family, tuple(_label(part, spec) for part in exc.parts) or (exc.message,)) for family, exc in refused]
    if not lacking:
        return NoFamily("no Hugging Face family can express this spec (no family is installed)", details=details)
    counts = Counter(part for _, parts in lacking for part in dict.fromkeys(parts))
    common, n = counts.most_common(1)[0]
    closest = sorted(lacking, key=lambda item: len(item[1]))[:CLOSEST]  # stable: the registry's order among equals
    groups: dict[tuple[str, ...], list[str]] = {}
    for family, parts in closest:
        groups.setdefault(parts, []).append(f"{family.name} ({family.model_type})")
    named = ", ".join(f"{_and(names)} {'lacks' if len(names) == 1 else 'lack'} "
                      f"{'that' if parts == (common,) else _and(list(parts))}" for parts, names in groups.items())
    return NoFamily(f"no Hugging Face family can express this spec: {common} has no counterpart in {n} of the "
                    f"{len(lacking)} families; the closest: {named}", details=details)


def _and(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _label(path: str, spec: dict[str, Any]) -> str:
    """``path`` with the spec's value when it is a short scalar (a dict or a list is left out: it says too much)."""
    value: Any = spec
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            return path
        value = value[key]
    if isinstance(value, (str, int, float, bool)) and len(repr(value)) <= SHORT_VALUE:
        return f"{path} {value!r}"
    return path


__all__ = ["NoFamily", "no_family"]
