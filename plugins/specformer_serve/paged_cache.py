"""A paged KV cache: keys and values live in fixed-size blocks handed to requests as they grow.

The static cache of ``generate`` allocates ``batch x capacity`` slots up front; a server
whose requests come and go at different lengths would waste most of that. Here every
layer owns one pool of ``num_blocks x block_size`` slots; a request holds a list of
blocks (its *block table*) and takes a new block only when its tokens fill the last one,
so memory follows what the requests really hold, and a finished request gives its blocks
back at once (vLLM's PagedAttention layout; the attention itself stays PyTorch's SDPA
over the gathered slots, which is what a CPU can do well).

Block 0 is the *null block*: never handed out, its slot positions always ``-1``. Block
tables of different lengths are padded with it, so a gathered batch has one width and
the padding is masked like any empty slot (:class:`specformer.model.context.KVCache` says a
negative position is never attended to).

:class:`BlockPool` is the bookkeeping (which blocks are free); :class:`PagedKVCache` is
the tensors and the KV-cache protocol.

A recurrent mixer (:mod:`specformer.model.state`) keeps a fixed-size state per sequence,
not per token: beside its blocks a running request holds one *state slot* (a row of every
recurrent layer's state tensors), claimed zeroed at admission and given back when it
ends. ``plan`` names each row's slot; ``read_state`` gathers those rows and
``write_state`` scatters them back, so a state costs the same at any length and never
moves between blocks. Before each forward the engine calls
:meth:`PagedKVCache.plan` with each row's block table and cached length; the first
layer's ``update`` then writes the slot positions and every layer reads through the same
gathered slot indices (one mask per forward).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor

from specformer.model.attention import CacheSlots, cache_slots_of
from specformer.model.state import StateSlots, states_by_layer, part_names

#: The block every padded block-table entry points to; its positions stay -1.
NULL_BLOCK = 0


class BlockPool:
    """Which of ``num_blocks`` blocks (ids ``1..num_blocks``; 0 is the null block) are free.

    ``allocate()`` hands out one block; ``release(blocks)`` takes them back. Not thread
    safe by itself: the engine owns it and calls it from its one thread.
    """

    def __init__(self, *, num_blocks: int, block_size: int) -> None:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"a block pool needs num_blocks >= 1, got {num_blocks!r}")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"a block pool needs block_size >= 1, got {block_size!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # Lowest ids first, so a quiet server keeps reusing the same few blocks.
        self._free = list(range(num_blocks, 0, -1))

    @property
    def free(self) -> int:
        return len(self._free)

    def blocks_for(self, tokens: int) -> int:
        """Blocks needed to hold ``tokens`` tokens."""
        return -(-tokens // self.block_size)

    def allocate(self) -> int:
        if not self._free:
            # The engine reserves blocks at admission, so this is a bug, not a busy server.
            raise RuntimeError("the block pool is empty: a request grew past the blocks reserved for it")
        return self._free.pop()

    def release(self, blocks: Sequence[int]) -> None:
        for block in blocks:
            if not 1 <= block <= self.num_blocks:
                raise ValueError(f"block {block} is not a block of this pool (1..{self.num_blocks})")
        if len(set(blocks)) != len(blocks) or set(blocks) & set(self._free):
            raise ValueError(f"releasing blocks {sorted(blocks)}: some are already free or listed twice")
        self._free.extend(sorted(blocks, reverse=True))


@dataclass(frozen=True)
class CachedLayer:
    """What the cache stores for one attention layer per token: a key and a value tensor of these sizes."""

    layer_index: int
    slots: CacheSlots  # key (key_heads, key_dim) and value (value_heads, value_dim) per token


@dataclass(frozen=True)
class StatefulLayer:
    """What the cache stores for one recurrent layer per sequence: the state tensors it declares."""

    layer_index: int
    slots: StateSlots


def cached_layers(model: Any) -> list[CachedLayer]:
    """The layers a paged cache must hold per token, from what each mixer declares it keeps.

    A layer's :func:`specformer.model.attention.cache_slots_of` says it: full keys and values,
    anything else stored as two tensors (a latent and a rotary key, for latent attention),
    or nothing (``None``: the layer is left out).
    """
    return [CachedLayer(layer_index=module.layer_index, slots=slots) for module in model.attention_modules()
            if (slots := cache_slots_of(module)) is not None]


def stateful_layers(model: Any) -> list[StatefulLayer]:
    """The layers that keep a recurrent state per sequence: their mixer's and feed-forward's
    (:func:`specformer.model.state.states_by_layer`)."""
    return [StatefulLayer(layer_index=index, slots=slots) for index, slots in states_by_layer(model)]


class PagedKVCache:
    """Implements :class:`specformer.model.context.KVCache` over block pools; see the module doc.

    ``PagedKVCache.for_model(model, num_blocks=N, block_size=16)``. Each caching layer holds
    its two tensors ``(1 + N) * block_size`` slots long (the null block first), laid out
    ``(slots, heads, dim)`` so a token's entry is one row to write and to gather.
    """

    def __init__(self, *, layers: Sequence[CachedLayer], num_blocks: int, block_size: int,
                 states: Sequence[StatefulLayer] = (), state_slots: int = 0,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.float32) -> None:
        if not layers and not states:
            raise ValueError("no layer of the model keeps a cache (per token or per sequence), so there is nothing to page")
        if states and state_slots < 1:
            raise ValueError(f"a model with recurrent layers needs state_slots >= 1 (one per running request), "
                             f"got {state_slots}")
        self.pool = BlockPool(num_blocks=num_blocks, block_size=block_size)
        self.block_size = block_size
        slots = (num_blocks + 1) * block_size
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self._keys: dict[int, Tensor] = {}
        self._values: dict[int, Tensor] = {}
        for layer in layers:
            shapes = layer.slots
            self._keys[layer.layer_index] = torch.zeros((slots, shapes.key_heads, shapes.key_dim), dtype=dtype,
                                                        device=self.device)
            self._values[layer.layer_index] = torch.zeros((slots, shapes.value_heads, shapes.value_dim), dtype=dtype,
                                                          device=self.device)
        self.slot_positions = torch.full((slots,), -1, dtype=torch.long, device=self.device)  # -1: empty
        self._first_layer = min(self._keys) if self._keys else None
        # Recurrent states: layer -> name -> (state_slots, *shape); one row per running request.
        self._states: dict[int, dict[str, Tensor]] = {
            layer.layer_index: {name: torch.zeros((state_slots, *shape), dtype=dtype, device=self.device)
                                for name, shape in layer.slots.tensors}
            for layer in states
        }
        self._free_states = list(range(state_slots - 1, -1, -1)) if states else []
        self._state_rows: Tensor | None = None  # (B,) each row's state slot in the planned forward
        #: The serve engine never rolls back, so mixers never hand over per-token states here.
        self.keep_steps = False
        self._write_slots: Tensor | None = None  # (B, T) where this forward's tokens go
        self._read_slots: Tensor | None = None  # (B, S) what each row attends to, block by block
        self._read_positions: Tensor | None = None  # (B, S)

    @classmethod
    def for_model(cls, model: Any, *, num_blocks: int, block_size: int, state_slots: int = 0) -> "PagedKVCache":
        """``state_slots``: how many requests may hold a recurrent state at once (the engine's batch size)."""
        reference = next(model.parameters())
        dtype = reference.dtype if reference.dtype.is_floating_point else torch.float32
        states = stateful_layers(model)
        return cls(layers=cached_layers(model), states=states, state_slots=state_slots if states else 0,
                   num_blocks=num_blocks, block_size=block_size, device=reference.device, dtype=dtype)

    # -- recurrent states ---------------------------------------------------------------------

    @property
    def has_states(self) -> bool:
        return bool(self._states)

    def claim_state(self) -> int:
        """A state slot for a new request, zeroed (a fresh sequence); RuntimeError when none is free."""
        if not self._free_states:
            # The engine admits at most as many requests as it has slots, so this is a bug, not a busy server.
            raise RuntimeError("every recurrent state slot is taken: more running requests than state slots")
        slot = self._free_states.pop()
        for states in self._states.values():
            for state in states.values():
                state[slot].zero_()
        return slot

    def release_state(self, slot: int) -> None:
        if slot in self._free_states or not 0 <= slot < self.state_slot_count:
            raise ValueError(f"state slot {slot} is not a taken slot of this cache")
        self._free_states.append(slot)

    @property
    def state_slot_count(self) -> int:
        first = next(iter(self._states.values()), None)
        return 0 if first is None else next(iter(first.values())).shape[0]

    def read_state(self, layer_index: int, positions: Tensor, *, part: str = "mixer") -> dict[str, Tensor]:
        """The planned rows' states of ``part`` (the layer's mixer or feed-forward), ``{name: (B, *shape)}``, before
        this forward."""
        if self._state_rows is None:
            raise RuntimeError("PagedKVCache.read_state before plan(..., state_rows=...): the engine plans each forward")
        held = self._states[layer_index]
        return {own: held[full].index_select(0, self._state_rows) for own, full in part_names(held, part).items()}

    def write_state(self, layer_index: int, states: dict[str, Tensor], *, steps: dict[str, Tensor] | None = None,
                    part: str = "mixer") -> None:
        """The planned rows' states of ``part`` after this forward, written back to their slots."""
        assert self._state_rows is not None
        held = self._states[layer_index]
        names = part_names(held, part)
        if set(states) != set(names):
            raise ValueError(f"layer {layer_index}'s {part} keeps the states {sorted(names)}, got {sorted(states)}")
        for own, value in states.items():
            held[names[own]].index_copy_(0, self._state_rows, value.to(held[names[own]].dtype))

    # -- before a forward -------------------------------------------------------------------

    def plan(self, tables: Sequence[Sequence[int]], cached: Sequence[int], new: int | Sequence[int], *,
             state_rows: Sequence[int] | None = None) -> None:
        """The next forward writes ``new`` tokens to each row (a count per row, or one for all), after its
        ``cached`` ones, in its blocks; ``state_rows[i]``: row ``i``'s state slot (a model with recurrent layers).

        Rows with fewer new tokens than the widest are left-padded: their first columns are
        padding (position ``-1`` in the forward), written to the null block and never read.
        ``tables[i]`` must already hold the blocks for ``cached[i] + new[i]`` tokens.
        """
        if self._states:
            if state_rows is None or len(state_rows) != len(tables):
                raise ValueError("a model with recurrent layers needs each row's state slot: plan(..., state_rows=[...])")
            self._state_rows = torch.tensor(list(state_rows), dtype=torch.long, device=self.device)
        bs = self.block_size
        news = [new] * len(tables) if isinstance(new, int) else list(new)
        for row, (blocks, length, count) in enumerate(zip(tables, cached, news)):
            if len(blocks) * bs < length + count:
                raise ValueError(f"row {row} has {len(blocks)} blocks of {bs} slots, too few for {length + count} tokens")
        width = max(len(table) for table in tables)
        padded = [list(table) + [NULL_BLOCK] * (width - len(table)) for table in tables]
        table = torch.tensor(padded, dtype=torch.long, device=self.device)  # (B, W)
        offsets = torch.arange(bs, device=self.device)
        self._read_slots = (table[:, :, None] * bs + offsets).reshape(len(tables), width * bs)  # (B, W*bs)
        longest = max(news)
        pad = torch.tensor([longest - n for n in news], device=self.device)[:, None]  # (B, 1) padding columns
        steps = torch.arange(longest, device=self.device)  # (T,)
        columns = torch.tensor(list(cached), device=self.device)[:, None] + steps - pad  # (B, T); < cached: padding
        slots = self._read_slots.gather(1, columns.clamp(min=0))  # (B, T): column c lives at read slot c
        self._write_slots = torch.where(steps < pad, NULL_BLOCK * bs, slots)
        self._read_positions = None

    # -- the KVCache protocol ---------------------------------------------------------------

    def update(self, layer_index: int, key: Tensor, value: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Store keys/values ``(B, n_kv, T, hd)`` in the planned slots; return every slot of each row's blocks."""
        if self._write_slots is None or self._read_slots is None:
            raise RuntimeError("PagedKVCache.update before plan(): the engine plans each forward")
        write, read = self._write_slots.reshape(-1), self._read_slots
        if layer_index == self._first_layer:  # the first layer that keeps keys: one write of the slot positions
            self.slot_positions.index_copy_(0, write, positions.reshape(-1))
            self._read_positions = self.slot_positions[read]  # (B, S); one tensor for every layer: one mask
        assert self._read_positions is not None
        keys, values = self._keys[layer_index], self._values[layer_index]
        keys.index_copy_(0, write, key.transpose(1, 2).reshape(-1, *keys.shape[1:]))  # (B*T, n_kv, hd)
        values.index_copy_(0, write, value.transpose(1, 2).reshape(-1, *values.shape[1:]))
        # (B, S, n_kv, hd) -> (B, n_kv, S, hd)
        return keys[read].transpose(1, 2), values[read].transpose(1, 2), self._read_positions

    # -- after a request ----------------------------------------------------------------------

    def free(self, blocks: Sequence[int]) -> None:
        """Give a finished request's blocks back, their slots marked empty (a new owner must not see old keys)."""
        if not blocks:
            return
        bs = self.block_size
        ids = torch.tensor(list(blocks), dtype=torch.long, device=self.device)
        slots = (ids[:, None] * bs + torch.arange(bs, device=self.device)).reshape(-1)
        self.pool.release(blocks)
        self.slot_positions.index_fill_(0, slots, -1)

    @property
    def nbytes(self) -> int:
        tensors = [*self._keys.values(), *self._values.values(), self.slot_positions]
        tensors += [t for states in self._states.values() for t in states.values()]
        return sum(t.numel() * t.element_size() for t in tensors)

    def bytes_per_block(self) -> int:
        per_slot = sum(t[0].numel() * t.element_size() for t in [*self._keys.values(), *self._values.values()])
        return per_slot * self.block_size
