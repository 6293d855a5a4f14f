"""The size check of a component that declares none: build it on the meta device and read its facts.

A component's params may declare their size check (``Params.sized``, see
:mod:`specformer.model.sized`); every built-in does, so validating a spec imports no
torch. One that does not is still checked the way every component once was: its module
is constructed on ``meta`` (shapes, no memory) with the same sizes, its constructor's
``ValueError`` is the problem, and the facts the builder reads (heads, widths, whether
it reads positions, its parameter count) are read from the module.

Siblings it receives (a layout's ``mixer`` and ``ffn``, the norms its ``make_norm``
makes) may have been checked without building; they are built here too, on meta, so the
constructor sees real modules.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from specformer.model.attention import cache_slots_of, kv_source_of
from specformer.model.positional import PositionalScheme, adds_to_embeddings
from specformer.model.residual import ResidualStream
from specformer.model.state import state_slots_of, uses_positions
from specformer.model.sized import Sized


def sized_by_building(component: Any, params: Any, sizes: dict[str, Any], *, facts: bool = True) -> Any:
    """``component`` built on meta for ``sizes``: its :class:`Sized` facts, or (``facts=False``) the module."""
    with torch.device("meta"):
        module = component.make(params, **{name: _as_module(value) for name, value in sizes.items()})
        return facts_of(module) if facts else module  # a stream's connection is made on meta too


def built_on_meta(build: Callable[[], Any]) -> Sized:
    """The facts of what ``build()`` makes on meta (a connection of a stream that does not declare its own)."""
    with torch.device("meta"):
        return facts_of(build())


def facts_of(module: Any) -> Sized:
    """What the builder reads from a built component, as a :class:`Sized`."""
    parameters = sum(p.numel() for p in module.parameters()) if isinstance(module, nn.Module) else None
    return Sized(
        parameters=parameters,
        n_heads=getattr(module, "n_heads", None),
        n_kv_heads=getattr(module, "n_kv_heads", None),
        head_dim=getattr(module, "head_dim", None),
        positional_dim=getattr(module, "positional_dim", None),
        uses_positions=uses_positions(module),
        caches_tokens=cache_slots_of(module) is not None,
        slots=getattr(module, "cache_slots", None),
        kv_from=kv_source_of(module),
        window=getattr(module, "window", None),
        keeps_state=state_slots_of(module) is not None,
        adds_to_embeddings=isinstance(module, PositionalScheme) and adds_to_embeddings(module),
        absent=bool(getattr(module, "absent", False)),
        n_streams=int(getattr(module, "n_streams", 1)),
        width=getattr(module, "width", None),
        per_layer_width=int(getattr(module, "per_layer_width", 0) or 0),
        connection=facts_of(module.connection()) if isinstance(module, ResidualStream) else None,
        name=type(module).__name__,
        build=lambda: module,
    )


def _as_module(value: Any) -> Any:
    """A sibling's :class:`Sized` as its module (built on meta); a maker of them as a maker of modules."""
    if isinstance(value, Sized):
        assert value.build is not None, "a Sized the registry made knows how to build its component"
        return value.build()
    if callable(value) and not isinstance(value, type):
        return lambda **kwargs: _as_module(value(**kwargs))
    return value


__all__ = ["built_on_meta", "facts_of", "sized_by_building"]
