"""Command-line overrides of spec values: ``--set train.lr=3e-4 --set model.n_layers=8``.

Each override is ``dotted.key=value``; the value is read as a YAML scalar (``3e-4``,
``true``, ``null``, ``[0.9, 0.99]``), and the whole spec is validated again afterwards,
so a misspelt key or a bad value is reported like any spec problem.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import yaml

from specformer.errors import UserError
from specformer.messages import join_path

_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def parse_value(text: str) -> Any:
    """A YAML scalar; numbers in exponent form without a dot (``3e-4``) are floats, as a person means."""
    stripped = text.strip()
    if _NUMBER.match(stripped):
        # Integers exactly (never through a float: 2**53 + 1 stays itself); the rest as floats.
        return int(stripped) if re.fullmatch(r"[+-]?\d+", stripped) else float(stripped)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UserError(f"--set value {text!r} is not a valid YAML value ({exc})") from None


def parse_override(item: str) -> tuple[list[str], Any]:
    """``"train.lr=3e-4"`` -> ``(["train", "lr"], 0.0003)``."""
    key, sep, value = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise UserError(f"--set {item!r}: expected KEY=VALUE with a dotted key, e.g. --set train.lr=3e-4")
    parts = key.split(".")
    if any(not p for p in parts):
        raise UserError(f"--set {item!r}: the key {key!r} has an empty part; write e.g. train.lr")
    return parts, parse_value(value)


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """A copy of spec ``data`` with each override applied in order (later ones win)."""
    out = copy.deepcopy(data)
    for item in overrides:
        parts, value = parse_override(item)
        node: Any = out
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif isinstance(child, str):
                # A component named by a bare string (`norm: rmsnorm`) gains params: {kind: rmsnorm, ...}.
                child = node[part] = {"kind": child}
            elif not isinstance(child, dict):
                where = join_path("", parts[: depth + 1])
                raise UserError(f"--set {item!r}: {where} is {child!r}, not a section that can hold {parts[depth + 1]!r}")
            node = child
        node[parts[-1]] = value
    return out
