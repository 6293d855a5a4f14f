"""Layers that share one block: found without walking every layer.

A spec's layers differ only through ``model.layers`` overrides, so a layer is fully
described by which overrides select it (its *signature*). Validation and size
estimates resolve and build one block per signature and multiply, which keeps
``validate`` and ``summary`` fast for a million layers.

Selections are ``range`` objects (slices, ``all``) or short explicit lists. Between
consecutive "boundaries" (where some range starts or stops, or an explicit index
sits) each range either covers the whole stretch or none of it, and within a
stretch membership of a range with step ``s`` repeats every ``s`` layers. So each
stretch needs looking at only ``lcm`` of the active steps layers, not all of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

Selection = "range | list[int]"


@dataclass(frozen=True)
class LayerGroup:
    """Layers selected by exactly the overrides ``overrides`` (indices into ``model.layers``, in order)."""

    overrides: tuple[int, ...]
    first: int  # the lowest layer index in the group
    count: int  # how many layers the group has


def membership(selections: Sequence["range | list[int]"]) -> list["range | frozenset[int]"]:
    """Selections in a form whose ``in`` is O(1): ranges stay, explicit lists become sets."""
    return [chosen if isinstance(chosen, range) else frozenset(chosen) for chosen in selections]


def overrides_of_layer(index: int, selections: Sequence["range | frozenset[int] | list[int]"]) -> tuple[int, ...]:
    """The signature of one layer: which overrides select it (pass :func:`membership` sets in loops)."""
    return tuple(j for j, chosen in enumerate(selections) if index in chosen)


def group_layers(n_layers: int, selections: Sequence["range | list[int]"]) -> list[LayerGroup]:
    """Every distinct signature among layers ``0..n_layers-1``, with its first layer and count.

    Groups are returned in order of their first layer. Cost grows with the number of
    overrides and the least common multiple of their steps, not with ``n_layers``.
    """
    selections = membership(selections)
    boundaries = {0, n_layers}
    for chosen in selections:
        if isinstance(chosen, range):
            if len(chosen):
                boundaries.update((chosen.start, chosen[-1] + 1))
        else:
            for i in chosen:
                boundaries.update((i, i + 1))
    edges = sorted(b for b in boundaries if 0 <= b <= n_layers)
    found: dict[tuple[int, ...], list[int]] = {}  # signature -> [first, count]
    for a, b in zip(edges, edges[1:]):
        steps = [c.step for c in selections if isinstance(c, range) and len(c) and c.start <= a and b <= c[-1] + 1]
        period = math.lcm(*steps) if steps else 1
        for i in range(a, min(b, a + period)):
            signature = overrides_of_layer(i, selections)
            count = (b - 1 - i) // period + 1  # i, i + period, ... below b
            if signature in found:
                found[signature][1] += count
            else:
                found[signature] = [i, count]
    groups = [LayerGroup(sig, first, count) for sig, (first, count) in found.items()]
    return sorted(groups, key=lambda g: g.first)


__all__ = ["LayerGroup", "group_layers", "membership", "overrides_of_layer"]
