"""Reading the structured files people write (YAML, JSON, TOML) within fixed bounds.

Spec files and sampler lists come from anywhere. Parsing one must end quickly with
plain data or one clear :class:`~specformer.errors.InputError`, whatever the bytes:

- at most :data:`MAX_FILE_BYTES` are read; the text must be UTF-8 (a BOM is allowed);
- nesting deeper than :data:`MAX_DEPTH` is refused (not a ``RecursionError``);
- a YAML document whose tree, with every alias expanded, would hold more than
  :data:`MAX_NODES` values is refused before it is built: a 1 KB "billion laughs"
  file shares its nodes in memory, but everything that walks it afterwards
  (validation, an error message printing it) would walk the expanded tree;
- a YAML alias that contains itself (``&a [*a]``) is refused;
- YAML is read with the safe loader only (no Python objects, no tags that run code).
"""

from __future__ import annotations

import json
import stat
import tomllib
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

from specformer.errors import InputError, excerpt
from specformer.messages import format_bytes, parse_error_message

#: Largest file read (bytes). Spec files and sampler lists are a few kilobytes.
MAX_FILE_BYTES = 4 * 1024 * 1024
#: Deepest nesting of mappings and lists accepted (a spec is about six levels deep).
MAX_DEPTH = 64
#: Most values (scalars, lists, mappings) in a document once YAML aliases are expanded.
MAX_NODES = 200_000

FORMATS = {".yaml": "YAML", ".yml": "YAML", ".json": "JSON", ".toml": "TOML"}


def read_data_file(path: str | Path, *, what: str = "file") -> Any:
    """Parse a .yaml/.yml/.json/.toml file into plain data, within the bounds above.

    ``what`` names the file in messages ("spec file", "sampler file"). Every failure
    is an :class:`InputError` whose message starts with the path.
    """
    path = Path(path)
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None and path_kind(path) != "directory":
        raise InputError(f"{path}: unsupported {what} type {path.suffix!r}; accepted: .yaml, .yml, .json, .toml")
    text = read_text(path, what=what)
    assert fmt is not None
    try:
        return parse_text(text, fmt)
    except InputError as exc:
        raise InputError(f"{path}: {exc}") from None


def read_text(path: Path, *, what: str = "file", max_bytes: int | None = None) -> str:
    """The UTF-8 text of ``path``; a directory, a missing file, a huge or non-UTF-8 one is an InputError."""
    max_bytes = MAX_FILE_BYTES if max_bytes is None else max_bytes
    found = path_kind(path)
    if found == "directory":
        raise InputError(f"{path}: is a directory, not a {what}")
    if found == "missing":
        raise InputError(f"{path}: no such file")
    if found != "file":
        # A FIFO or a device would block or never end; a spec is a regular file.
        raise InputError(f"{path}: is not a regular file ({found}); give a {what}")
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise InputError(f"{path}: cannot read the {what} ({exc.strerror or exc})") from None
    if len(data) > max_bytes:
        raise InputError(f"{path}: the {what} is larger than {format_bytes(max_bytes)}, the most accepted")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{path}: the {what} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); save it as UTF-8"
        ) from None


def path_kind(path: Path) -> str:
    """"file", "directory", "missing", or what else the path is, without following it into a hang."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "missing"
    except OSError as exc:  # a name too long, a loop of links, no permission to look
        raise InputError(f"{excerpt(str(path))}: cannot be opened ({exc.strerror or exc})") from None
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISREG(mode):
        return "file"
    return "a pipe" if stat.S_ISFIFO(mode) else "a device or socket"


def parse_text(text: str, fmt: str) -> Any:
    """Parse ``text`` as ``fmt`` ("YAML", "JSON" or "TOML") within the bounds; InputError otherwise."""
    try:
        if fmt == "YAML":
            data = parse_yaml(text)
        elif fmt == "JSON":
            data = json.loads(text)
        elif fmt == "TOML":
            data = tomllib.loads(text)
        else:
            raise ValueError(f"unknown format {fmt!r}")
    except RecursionError:
        raise InputError(f"nested more than {MAX_DEPTH} levels deep, the most accepted") from None
    except (yaml.YAMLError, json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise InputError(_first_line(parse_error_message(exc, fmt))) from None  # line/column, not "<unicode string>"
    check_shape(data)
    return data


def parse_yaml(text: str) -> Any:
    """YAML through the safe loader, with depth, alias and expanded-size bounds."""
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    except InputError:
        raise
    except (ValueError, TypeError, OverflowError) as exc:
        # An explicit tag on a value it cannot convert (`!!float 1e!x`, `!!int x`, a `2001-13-45`
        # timestamp): PyYAML's constructors raise plain Python errors (found by fuzzing).
        raise InputError(f"a YAML value cannot be read as its type ({excerpt(str(exc), 120)})") from None
    finally:
        loader.dispose()


def check_shape(data: Any) -> None:
    """Refuse data nested deeper than MAX_DEPTH or holding more than MAX_NODES values (iteratively)."""
    count = 0
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        item, depth = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise InputError(f"holds more than {MAX_NODES:,} values, the most accepted")
        if isinstance(item, dict):
            if depth > MAX_DEPTH:
                raise InputError(f"nested more than {MAX_DEPTH} levels deep, the most accepted")
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            if depth > MAX_DEPTH:
                raise InputError(f"nested more than {MAX_DEPTH} levels deep, the most accepted")
            stack.extend((v, depth + 1) for v in item)


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that counts depth while composing and the expanded size before constructing."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise InputError(f"nested more than {MAX_DEPTH} levels deep, the most accepted")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def get_single_node(self) -> Node | None:
        node = super().get_single_node()
        if node is not None:
            _expanded_size(node)
        return node


def _expanded_size(root: Node) -> int:
    """Values in the tree under ``root`` with aliases expanded; shared nodes are counted once per use.

    Computed on the node graph with memoisation (linear in distinct nodes), so a bomb
    is measured without being expanded. A node reachable from itself is refused.
    """
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    # Iterative post-order walk: (node, children visited?)
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        children = _children(node)
        if done:
            on_path.discard(key)
            total = 1 + sum(sizes[id(c)] for c in children)
            if total > MAX_NODES:
                raise InputError(
                    f"holds more than {MAX_NODES:,} values once its aliases (*name) are expanded, the most accepted"
                )
            sizes[key] = total
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise InputError("a YAML alias refers to a value that contains it (a recursive structure)")
        on_path.add(key)
        stack.append((node, True))
        for child in children:
            if id(child) in on_path:
                raise InputError("a YAML alias refers to a value that contains it (a recursive structure)")
            if id(child) not in sizes:
                stack.append((child, False))
    return sizes[id(root)]


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _first_line(exc: Exception | str) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 200 else text[:200] + "…"


__all__ = ["MAX_DEPTH", "MAX_FILE_BYTES", "MAX_NODES", "check_shape", "parse_text", "path_kind", "parse_yaml", "read_data_file", "read_text"]
