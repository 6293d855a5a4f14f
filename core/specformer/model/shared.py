"""Shared blocks: one block's weights run at several depths, each use with a cache of its own.

``model.shared_blocks`` names blocks that are built once (their tensors stored once, under
``shared_blocks.<name>.*``) and ``model.layers[].shared`` runs one before the selected layers'
own block (Zamba's shared attention). The weights are shared; what a use remembers between
forward passes is not: the keys a shared attention wrote at layer 5 are not the ones it reads
at layer 11. So every use gets a cache slot of its own, numbered after the layers
(``n_layers + k`` for the k-th use in layer order), and the block reaches its slot through
:class:`UseCache`, which renames the block's own layer index (the first layer that runs it)
to the use's slot. Caches learn of the slots from ``Decoder.attention_modules()``, which lists
one :class:`SharedUse` per use after the layers' own mixers.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from torch import Tensor

from specformer.model.context import ForwardContext


class UseCache:
    """A cache as one use of a shared block sees it: the block's layer index renamed to the use's slot."""

    def __init__(self, cache: Any, *, home: int, slot: int) -> None:
        self._cache, self._home, self._slot = cache, home, slot

    def _at(self, layer_index: int) -> int:
        return self._slot if layer_index == self._home else layer_index

    def update(self, layer_index: int, key: Tensor, value: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return self._cache.update(self._at(layer_index), key, value, positions)

    def __getattr__(self, name: str) -> Any:
        # read_state / write_state (a recurrent shared block) take the layer first; the rest (keep_steps) passes through.
        found = getattr(self._cache, name)
        if name in ("read_state", "write_state"):
            return lambda layer_index, *args, **kwargs: found(self._at(layer_index), *args, **kwargs)
        return found


class SharedUse:
    """The public facts of one use of a shared block's mixer (what a cache lays out), at the use's own slot.

    Every fact is the mixer's except ``layer_index``; ``block`` is the shared block itself.
    """

    def __init__(self, mixer: Any, *, block: Any, slot: int, layer: int) -> None:
        self.__dict__.update(_mixer=mixer, block=block, layer_index=slot, used_at=layer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_mixer"], name)


def use_context(ctx: ForwardContext, *, home: int, slot: int) -> ForwardContext:
    """``ctx`` for one use of a shared block whose mixer was built as layer ``home``: the cache at the use's
    slot, and the model-level positional scheme (a shared block takes no per-layer scheme)."""
    cache = UseCache(ctx.cache, home=home, slot=slot) if ctx.cache is not None else None
    return replace(ctx, cache=cache, layer_schemes=None, layer_states=None)


__all__ = ["SharedUse", "UseCache", "use_context"]
