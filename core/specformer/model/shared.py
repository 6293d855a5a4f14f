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

What each use has of its own besides its cache (``output``, ``projection``, ``adapters`` of a
shared block's spec) lives in :class:`UseParts`, one per using layer (``shared_use_parts.<layer>.*``):
a projection of the block's output, and low-rank adapters that :class:`AdapterHook` adds to the
outputs of named linear maps of the block while that use runs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import Tensor, nn

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


class LowRank(nn.Module):
    """``B (A x)``: ``down`` is A (rank x inputs), ``up`` is B (rows x rank); no biases."""

    def __init__(self, *, inputs: int, rows: int, rank: int) -> None:
        super().__init__()
        self.down = nn.Linear(inputs, rank, bias=False)
        self.up = nn.Linear(rank, rows, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.up(self.down(x))


class UseParts(nn.Module):
    """The weights one use of a shared block has of its own: ``projection`` (d_model x d_model, or absent) and
    ``adapters[<module path, dots kept as nesting>]``: one :class:`LowRank` per output piece of that linear map."""

    def __init__(self, *, d_model: int, projection: bool, adapters: Any = None) -> None:
        super().__init__()
        self.projection = nn.Linear(d_model, d_model, bias=False) if projection else None
        self.adapters = nn.ModuleDict()
        for path, target in (adapters.targets.items() if adapters is not None else ()):
            node = self.adapters
            for name in path.split(".")[:-1]:  # mixer.qkv -> adapters.mixer.qkv.<piece>.*
                if name not in node:
                    node[name] = nn.ModuleDict()
                node = node[name]
            node[path.split(".")[-1]] = nn.ModuleList(LowRank(inputs=target.inputs, rows=rows, rank=adapters.rank)
                                                      for rows in target.outputs)

    def pieces(self, path: str) -> nn.ModuleList:
        """The adapter pairs of the linear map at ``path`` inside the shared block."""
        node: Any = self.adapters
        for name in path.split("."):
            node = node[name]
        return node


class AdapterHook:
    """A forward hook on one linear map of a shared block: while a use runs (``active`` set), its adapter pairs'
    outputs are added to the map's output, each to its piece of the rows."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.active: UseParts | None = None

    def __call__(self, module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> Tensor | None:
        if self.active is None:
            return None
        x = inputs[0]
        delta = [pair(x) for pair in self.active.pieces(self.path)]  # each (..., piece rows)
        return output + (delta[0] if len(delta) == 1 else torch.cat(delta, dim=-1))


def attach_adapter_hooks(block: nn.Module, adapters: Any, *, name: str) -> list[AdapterHook]:
    """One :class:`AdapterHook` on each linear map ``adapters.targets`` names in ``block``; ValueError naming a path
    that is no linear map of the block, or one whose widths are not the ones written."""
    hooks = []
    for path, target in adapters.targets.items():
        try:
            module = block.get_submodule(path)
        except AttributeError:
            module = None
        if not isinstance(module, nn.Linear):
            linears = sorted(n for n, m in block.named_modules() if isinstance(m, nn.Linear))
            raise ValueError(f"shared block {name!r}: adapters.targets names {path!r}, which is not a linear map of the "
                             f"block; its linear maps are {linears}")
        if (module.in_features, module.out_features) != (target.inputs, sum(target.outputs)):
            raise ValueError(f"shared block {name!r}: adapters.targets.{path} gives inputs {target.inputs} and outputs "
                             f"{target.outputs} (sum {sum(target.outputs)}), but the map is "
                             f"{module.in_features} -> {module.out_features}")
        hook = AdapterHook(path)
        module.register_forward_hook(hook)
        hooks.append(hook)
    return hooks


def use_context(ctx: ForwardContext, *, home: int, slot: int) -> ForwardContext:
    """``ctx`` for one use of a shared block whose mixer was built as layer ``home``: the cache at the use's
    slot, and the model-level positional scheme (a shared block takes no per-layer scheme)."""
    cache = UseCache(ctx.cache, home=home, slot=slot) if ctx.cache is not None else None
    return replace(ctx, cache=cache, layer_schemes=None, layer_states=None, mixer_addend=None)


__all__ = ["AdapterHook", "LowRank", "SharedUse", "UseCache", "UseParts", "attach_adapter_hooks", "use_context"]
