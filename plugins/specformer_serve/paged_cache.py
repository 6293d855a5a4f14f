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
the tensors and the KV-cache protocol. Before each forward the engine calls
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


def cached_layers(model: Any) -> list[CachedLayer]:
    """The layers a paged cache must hold, from what each attention declares it keeps per token.

    A layer's :func:`specformer.model.attention.cache_slots_of` says it: full keys and values,
    anything else stored as two tensors (a latent and a rotary key, for latent attention),
    or nothing (``None``: the layer is left out).
    """
    layers = []
    for module in model.attention_modules():
        slots = cache_slots_of(module)
        if slots is not None:
            layers.append(CachedLayer(layer_index=module.layer_index, slots=slots))
    if not layers:
        raise ValueError("no attention layer of the model keeps a cache, so there is nothing to page")
    return layers


class PagedKVCache:
    """Implements :class:`specformer.model.context.KVCache` over block pools; see the module doc.

    ``PagedKVCache.for_model(model, num_blocks=N, block_size=16)``. Each caching layer holds
    its two tensors ``(1 + N) * block_size`` slots long (the null block first), laid out
    ``(slots, heads, dim)`` so a token's entry is one row to write and to gather.
    """

    def __init__(self, *, layers: Sequence[CachedLayer], num_blocks: int, block_size: int,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.float32) -> None:
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
        self._first_layer = min(self._keys)
        self._write_slots: Tensor | None = None  # (B, T) where this forward's tokens go
        self._read_slots: Tensor | None = None  # (B, S) what each row attends to, block by block
        self._read_positions: Tensor | None = None  # (B, S)

    @classmethod
    def for_model(cls, model: Any, *, num_blocks: int, block_size: int) -> "PagedKVCache":
        reference = next(model.parameters())
        dtype = reference.dtype if reference.dtype.is_floating_point else torch.float32
        return cls(layers=cached_layers(model), num_blocks=num_blocks, block_size=block_size,
                   device=reference.device, dtype=dtype)

    # -- before a forward -------------------------------------------------------------------

    def plan(self, tables: Sequence[Sequence[int]], cached: Sequence[int], new: int | Sequence[int]) -> None:
        """The next forward writes ``new`` tokens to each row (a count per row, or one for all), after its
        ``cached`` ones, in its blocks.

        Rows with fewer new tokens than the widest are left-padded: their first columns are
        padding (position ``-1`` in the forward), written to the null block and never read.
        ``tables[i]`` must already hold the blocks for ``cached[i] + new[i]`` tokens.
        """
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
        if layer_index == self._first_layer:
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
        return sum(t.numel() * t.element_size() for t in tensors)

    def bytes_per_block(self) -> int:
        per_slot = sum(t[0].numel() * t.element_size() for t in [*self._keys.values(), *self._values.values()])
        return per_slot * self.block_size
