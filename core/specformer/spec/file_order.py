"""Problems in the order their places appear in the file, so a person can fix them top to bottom.

Checks run in the order the pipeline needs (structure, sections, components), but a
parsed YAML, JSON or TOML mapping keeps the order its keys were written in, so the
place a dotted path names (``model.layers[1].mixer.window``) can be located in the
data. A path to a field that is not written (a missing required field) sorts after its
parent's written fields; problems at the same place keep the order they were found in.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from specformer.errors import Problem

#: One step of a dotted path: ``.field``, a leading ``field``, or ``[i]`` (see :func:`specformer.messages.join_path`).
_STEP = re.compile(r"\[(\d+)\]|\.?([^.\[]+)")


def in_file_order(problems: Sequence[Problem], data: Any) -> list[Problem]:
    """``problems`` sorted by where their paths are written in ``data`` (stable for ties)."""
    positions: dict[int, dict[Any, int]] = {}  # id of a mapping -> its keys' positions, built once per mapping

    def position(path: str) -> tuple[int, ...]:
        node, where = data, []
        for index, key in _STEP.findall(path):
            if isinstance(node, dict):
                order = positions.setdefault(id(node), {k: i for i, k in enumerate(node)})
                name = key or index  # a mapping with an index-like key is still a mapping
                if name not in order:
                    where.append(len(order))
                    break
                where.append(order[name])
                node = node[name]
            elif isinstance(node, list) and index and int(index) < len(node):
                where.append(int(index))
                node = node[int(index)]
            else:
                break
        return tuple(where)

    return sorted(problems, key=lambda p: position(p.path))


__all__ = ["in_file_order"]
