"""What a stored optimizer state may hold, checked before ``torch.optim`` sees any of it.

A checkpoint's optimizer state is untrusted input: a forged value (a ``"step"`` that is a
string, a moment shaped like no parameter, a learning rate that is a list) would otherwise
reach the optimizer and fail deep inside it, or train on nonsense. Both checkpoint formats
(``optimizer.safetensors``, and a sharded checkpoint's ``sharded.json`` and shards) hold the
same things, checked here alike:

- a state tensor (``<parameter>/<key>``) belongs to a stored parameter and has a floating
  dtype and either the parameter's shape (a moment: AdamW's, Lion's, Muon's and SGD's
  buffers) or no dimensions (a step count): every optimizer here keeps nothing else;
- a state value that is not a tensor (JSON in the header) is a number;
- the parameter groups are a list of mappings whose ``params`` is a list of names and whose
  other values are numbers, booleans, null, strings or flat lists of those (torch's and the
  group rules' settings), so nothing nests;
- when applied, each group's settings have the kind the optimizer being resumed has for them
  (:func:`group_problems`).
"""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor

from specformer.renamed import current_name

#: torch dtype names a state tensor may have (a moment or a count is a float).
FLOATING = frozenset({"float64", "float32", "float16", "bfloat16"})


def is_number(value: Any) -> bool:
    """An int or a finite float; a bool is not a number."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_setting(value: Any) -> bool:
    return value is None or isinstance(value, (bool, str)) or is_number(value)


def current_slots(slots: Any) -> Any:
    """A mapping of slots (``<parameter>/<key>``) or parameter names stored before a rename, keyed as they are now.

    Anything that is not a mapping is returned as it is, for :func:`state_problems` to report.
    """
    if not isinstance(slots, dict):
        return slots
    return {current_name(k) if isinstance(k, str) else k: v for k, v in slots.items()}


def current_groups(groups: Any) -> Any:
    """Parameter groups whose ``params`` were named before a rename, as they are named now (malformed ones as they are)."""
    if not isinstance(groups, list):
        return groups
    return [{**g, "params": [current_name(n) if isinstance(n, str) else n for n in g["params"]]}
            if isinstance(g, dict) and isinstance(g.get("params"), list) else g for g in groups]


def state_problems(tensors: dict[str, tuple[list[int], str]], scalars: Any, weights: dict[str, list[int]],
                   groups: Any) -> list[str]:
    """What is wrong with a stored optimizer state (empty when nothing is).

    ``tensors``: slot ``<parameter>/<key>`` -> (shape, torch dtype name); ``scalars``: slot -> value;
    ``weights``: the stored parameters' shapes, by name; ``groups``: the parameter groups.
    """
    problems = []
    listed: set[Any] | None = None  # the parameters the groups name (None while the groups are unreadable)
    if not (isinstance(groups, list) and all(isinstance(g, dict) and isinstance(g.get("params"), list)
                                             for g in groups)):
        problems.append("param_groups must be a list of groups with their params")
    else:
        listed = set()
        for number, group in enumerate(groups):
            for key, value in group.items():
                flat = value if isinstance(value, list) else [value]
                if key == "params":
                    if not all(isinstance(p, str) and p in weights for p in flat) or listed & set(flat):
                        problems.append(f"group {number}'s params must name stored parameters, each in one group")
                    listed.update(p for p in flat if isinstance(p, str))
                elif not all(_is_setting(v) for v in flat):
                    problems.append(f"group {number}'s {key!r} is not a number, boolean, null, string or a flat list "
                                    "of them")

    def owner(slot: str) -> str | None:
        name, _, key = slot.rpartition("/")
        if name not in weights or not key or (listed is not None and name not in listed):
            problems.append(f"the state {slot!r} belongs to no parameter of the saved weights and groups")
            return None
        return name

    for slot, (shape, dtype) in tensors.items():
        name = owner(slot)
        if name is None:
            continue
        if list(shape) not in (list(weights[name]), []):
            problems.append(f"the state of {name!r} does not match the saved weights ({slot.rpartition('/')[2]} "
                            f"shaped {list(shape)}, expected {list(weights[name])} or [] for a count)")
        elif dtype not in FLOATING:
            problems.append(f"the state {slot!r} is {dtype}, expected a floating dtype")
    if not isinstance(scalars, dict):
        problems.append(f"the scalars are a {type(scalars).__name__}, expected a mapping")
        return problems
    for slot, value in scalars.items():
        if owner(slot) is None:
            continue
        if slot in tensors:
            problems.append(f"the state {slot!r} is stored both as a tensor and as a scalar")
        elif not is_number(value):
            problems.append(f"the state {slot!r} is {value!r}, expected a number")
    return problems


def _alike(value: Any, like: Any) -> bool:
    """Whether a stored setting has the kind the live optimizer's setting has."""
    if like is None or isinstance(like, bool):
        return value is None or isinstance(value, bool)  # torch's flags: foreach and fused are None or a bool
    if isinstance(like, (int, float, Tensor)):
        return is_number(value)
    if isinstance(like, (tuple, list)):
        return isinstance(value, (tuple, list)) and len(value) == len(like) and all(map(_alike, value, like))
    if isinstance(like, str):
        return isinstance(value, str)
    return True  # a kind torch keeps that JSON cannot hold: torch's own business


def group_problems(saved: list[dict[str, Any]], live: list[dict[str, Any]]) -> list[str]:
    """Stored group settings of another kind than the optimizer being resumed has (a learning rate that is a string)."""
    problems = []
    for number, (group, own) in enumerate(zip(saved, live)):
        for key, like in own.items():
            if key != "params" and key in group and not _alike(group[key], like):
                problems.append(f"group {number}'s {key} is {group[key]!r}, expected one like {like!r}")
    return problems
