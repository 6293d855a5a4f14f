"""A static key/value cache: preallocated buffers written by index, ring buffers for sliding windows.

Every layer gets what its attention declares it keeps per token
(:func:`specformer.model.attention.cache_slots_of`: by default keys and values
``(B, n_kv_heads, S, head_dim)``; a latent attention keeps a compressed latent and a
shared rotary key instead; a layer that keeps nothing gets no buffer) allocated once, with
``S`` the prompt plus the new tokens (not the context length). A layer whose attention
has a ``window`` (or a ``chunk``: :func:`specformer.model.attention.reach_of`) shorter than
that keeps only a ring of that many slots, so its memory is bounded by the window whatever
the length generated.

The cache knows nothing about positional schemes. It stores keys as attention hands
them over (already rotated, for RoPE) with the absolute position of each slot, ``-1``
for a slot that is empty or holds padding, and returns those positions with the keys:
attention builds its causal / window / padding mask and any position bias (ALiBi) from
them. So learned, sinusoidal, rotary, biased and absent position schemes all just work.

Columns, not positions, decide where a token is written: every row of a batch writes
the same column on each forward (prompts are left-padded), counted by ``cursor``, a
tensor on the device, so the decode loop never reads it back. Layers are expected in
order: the first layer's ``update`` of a forward claims the columns for all layers (its
``read_state`` when it keeps no keys).

A recurrent mixer (:mod:`specformer.model.state`) keeps a fixed-size state per row
instead: the cache holds one buffer per declared state tensor, ``(B, *shape)``, zeros for
a fresh row; a feed-forward that keeps a state adds its tensors to its layer's
(:func:`specformer.model.state.layer_state_slots`). Beam search reorders states with the
rows; :meth:`StaticKVCache.rollback`
(speculative decoding) restores the state after the last kept token, from the per-token
states the mixers hand over while :attr:`StaticKVCache.keep_steps` is set.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import Tensor

from specformer.model.attention import cache_slots_of, reach_of
from specformer.model.state import STATE_PARTS, StateSlots, states_by_layer, part_names, state_slots_of


@dataclass(frozen=True)
class LayerShape:
    """What the cache needs to know about one attention layer.

    Its two tensors are ``(B, n_kv_heads, S, head_dim)`` ("keys") and
    ``(B, value_heads, S, value_dim)`` ("values"; by default the same shape as the keys).
    """

    layer_index: int
    n_kv_heads: int
    head_dim: int
    window: int | None = None
    value_heads: int | None = None  # default n_kv_heads
    value_dim: int | None = None  # default head_dim

    @classmethod
    def of(cls, layer: Any) -> "LayerShape | None":
        """The shape an attention layer declares (:func:`~specformer.model.attention.cache_slots_of`); None if it keeps nothing."""
        slots = cache_slots_of(layer)
        if slots is None:
            return None
        return cls(layer_index=int(layer.layer_index), n_kv_heads=slots.key_heads, head_dim=slots.key_dim,
                   window=reach_of(layer), value_heads=slots.value_heads, value_dim=slots.value_dim)


@dataclass(frozen=True)
class StateShape:
    """What the cache needs to know about one recurrent layer: its index and its state (mixer's and feed-forward's)."""

    layer_index: int
    slots: StateSlots

    @classmethod
    def of(cls, layer: Any) -> "StateShape | None":
        """The state a mixer declares (:func:`~specformer.model.state.state_slots_of`); None if it keeps none."""
        slots = state_slots_of(layer)
        return None if slots is None else cls(layer_index=int(layer.layer_index), slots=slots)


@dataclass
class _Segment:
    """The states around one forward run while steps were kept: before it, and after each of its tokens."""

    start: int  # the forward's first column
    length: int  # its columns
    before: dict[int, dict[str, Tensor]] = field(default_factory=dict)  # layer -> name -> (B, *shape)
    after: dict[int, dict[str, Tensor]] = field(default_factory=dict)  # layer -> name -> (B, T, *shape)


@dataclass
class _SlotGroup:
    """Layers sharing a buffer length; they share the slot positions too (one mask per forward)."""

    size: int
    ring: bool
    positions: Tensor  # (B, size) absolute position held by each slot; -1 = empty or padding
    slots: Tensor | None = None  # slots written by the current forward
    kept: int = 0  # how many of the current forward's tokens are written (the last ones)
    read_positions: Tensor | None = None  # (B, S_read) positions of what update() returns


@dataclass
class _Layer:
    keys: Tensor  # (B, n_kv, size, hd)
    values: Tensor  # (B, n_kv, size, hd)
    group: _SlotGroup


class StaticKVCache:
    """Implements :class:`specformer.model.context.KVCache` with fixed-size buffers; see the module doc.

    ``StaticKVCache.for_model(model, batch_size=B, capacity=S)`` sizes it for a model;
    then pass it with absolute positions: ``model(ids, positions=pos, cache=cache)``.
    Writing more than ``capacity`` columns into a layer without a window raises an index
    error from ``index_copy_``.
    """

    def __init__(
        self,
        *,
        layers: Sequence[LayerShape],
        states: Sequence[StateShape] = (),
        batch_size: int,
        capacity: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
        spare: int = 0,
    ) -> None:
        if batch_size < 1 or capacity < 1 or spare < 0:
            raise ValueError(f"a cache needs batch_size >= 1, capacity >= 1 and spare >= 0, got {batch_size}, "
                             f"{capacity} and {spare}")
        if not layers and not states:
            raise ValueError("a cache needs at least one layer that keeps something (per token or per sequence)")
        self.batch_size = batch_size
        self.capacity = capacity
        self.spare = spare
        self.cursor = torch.zeros((), dtype=torch.long, device=device)  # columns written so far
        groups: dict[int, _SlotGroup] = {}
        self._layers: dict[int, _Layer] = {}
        for shape in layers:
            # ``spare`` extra ring slots keep the keys a rolled-back column had overwritten.
            window = None if shape.window is None else shape.window + spare
            ring = window is not None and window < capacity
            size = window if ring else capacity
            assert size is not None
            if size not in groups:
                positions = torch.full((batch_size, size), -1, dtype=torch.long, device=device)
                groups[size] = _SlotGroup(size=size, ring=ring, positions=positions)
            keys = (batch_size, shape.n_kv_heads, size, shape.head_dim)
            values = (batch_size, shape.value_heads or shape.n_kv_heads, size, shape.value_dim or shape.head_dim)
            self._layers[shape.layer_index] = _Layer(
                keys=torch.zeros(keys, dtype=dtype, device=device),
                values=torch.zeros(values, dtype=dtype, device=device),
                group=groups[size],
            )
        self._groups = list(groups.values())
        # A state tensor that grows with the tokens (compressed attention's entries) gets the rows this capacity needs.
        self._states: dict[int, dict[str, Tensor]] = {
            shape.layer_index: {name: torch.zeros((batch_size, *size), dtype=dtype, device=device)
                                for name, size in shape.slots.shapes_for(capacity + spare).items()}
            for shape in states
        }
        # Each part's own names in its layer's state (the feed-forward's are prefixed there).
        self._parts: dict[int, dict[str, dict[str, str]]] = {
            index: {part: names for part, _ in STATE_PARTS if (names := part_names(held, part))}
            for index, held in self._states.items()
        }
        self._first_layer = min([*self._layers, *self._states])
        # The part that reads the first layer's state first in a forward claims the columns (if the layer keeps no keys).
        self._first_part = next(iter(self._parts.get(self._first_layer, {})), None)
        #: Set while the mixers should hand over the state after each token, so :meth:`rollback` can return
        #: to any of the last ``spare`` columns (speculative decoding sets it after the prefill).
        self.keep_steps = False
        self._segments: list[_Segment] = []  # forwards run with keep_steps, the reachable ones

    @classmethod
    def for_model(
        cls,
        model: Any,
        *,
        batch_size: int,
        capacity: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        spare: int = 0,
    ) -> "StaticKVCache":
        """A cache for every attention layer of ``model``, on its device and in its dtype by default.

        ``spare``: how many of the last written columns :meth:`rollback` may drop (ring layers
        keep that many slots beyond their window; speculative decoding passes its draft length).
        """
        reference = next(model.parameters())
        # Each attention's public facts (specformer.model.attention.AttentionLayer): what it caches, and where.
        mixers = model.attention_modules()
        layers = [shape for shape in map(LayerShape.of, mixers) if shape is not None]
        # Each layer's state: its mixer's and its feed-forward's (specformer.model.state.states_by_layer).
        states = [StateShape(layer_index=index, slots=slots) for index, slots in states_by_layer(model)]
        return cls(layers=layers, states=states, batch_size=batch_size, capacity=capacity,
                   device=device or reference.device, dtype=dtype or reference.dtype, spare=spare)

    # -- the KVCache protocol ------------------------------------------------------------

    def update(self, layer_index: int, key: Tensor, value: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Store this forward's keys/values ``(B, n_kv, T, hd)`` at ``positions`` ``(B, T)``; return what to attend to.

        Keys and values may differ in heads and width (see :class:`LayerShape`)."""
        if layer_index == self._first_layer:
            self._claim_columns(positions)
        layer = self._layers[layer_index]
        group = layer.group
        assert group.slots is not None and group.read_positions is not None
        if group.ring and key.shape[2] > 1:
            # Several tokens into a ring: a later one may overwrite a slot an earlier one still
            # needs, so attend to the ring as it was plus all the new tokens.
            keys = torch.cat((layer.keys, key), dim=2)  # (B, n_kv, size + T, hd)
            values = torch.cat((layer.values, value), dim=2)
            layer.keys.index_copy_(2, group.slots, key[:, :, -group.kept :])
            layer.values.index_copy_(2, group.slots, value[:, :, -group.kept :])
            return keys, values, group.read_positions
        layer.keys.index_copy_(2, group.slots, key)
        layer.values.index_copy_(2, group.slots, value)
        return layer.keys, layer.values, group.read_positions

    # -- the RecurrentStateCache protocol ----------------------------------------------------

    def read_state(self, layer_index: int, positions: Tensor, *, part: str = "mixer") -> dict[str, Tensor]:
        """``part``'s state of every row before this forward, ``{name: (B, *shape)}`` (read-only: write with
        :meth:`write_state`)."""
        # A layer that keeps keys too (attention beside a recurrence) claims the columns in ``update``.
        if layer_index == self._first_layer and layer_index not in self._layers and part == self._first_part:
            self._claim_columns(positions)
        held = self._states[layer_index]
        return {own: held[full] for own, full in self._names(layer_index, part).items()}

    def write_state(self, layer_index: int, states: dict[str, Tensor], *, steps: dict[str, Tensor] | None = None,
                    part: str = "mixer") -> None:
        """Store ``part``'s state after this forward; with :attr:`keep_steps`, ``steps`` (the state after each token)."""
        held, names = self._states[layer_index], self._names(layer_index, part)
        if self.keep_steps and self._segments:
            if steps is None or set(steps) != set(names):
                raise ValueError(f"layer {layer_index} must hand over the state after each token while keep_steps is set "
                                 f"(its {part}'s steps for {sorted(names)})")
            segment = self._segments[-1]
            segment.before.setdefault(layer_index, {}).update({full: held[full].clone() for full in names.values()})
            segment.after.setdefault(layer_index, {}).update({names[own]: value for own, value in steps.items()})
        if set(states) != set(names):
            raise ValueError(f"layer {layer_index}'s {part} keeps the states {sorted(names)}, got {sorted(states)}")
        for own, value in states.items():
            held[names[own]].copy_(value)

    def _names(self, layer_index: int, part: str) -> dict[str, str]:
        """``part``'s own state names in layer ``layer_index`` and theirs in the layer's state (KeyError: none)."""
        names = self._parts.get(layer_index, {}).get(part)
        if names is None:
            kept = {index: sorted(parts) for index, parts in self._parts.items()}
            raise KeyError(f"layer {layer_index}'s {part} keeps no state in this cache (states kept: {kept})")
        return names

    def _claim_columns(self, positions: Tensor) -> None:
        """Once per forward: the columns (hence slots) the new tokens go to, and the slot positions."""
        length = positions.shape[1]
        if self._states and self.keep_steps:
            start = int(self.cursor)
            # Only the last ``spare`` columns can be rolled back to: older segments are dropped.
            self._segments = [s for s in self._segments if s.start + s.length >= start - self.spare]
            self._segments.append(_Segment(start=start, length=length))
        columns = self.cursor + torch.arange(length, device=self.cursor.device)  # (T,)
        for group in self._groups:
            if group.ring:
                group.kept = min(length, group.size)
                group.slots = columns[length - group.kept :] % group.size
                if length > 1:
                    group.read_positions = torch.cat((group.positions, positions), dim=1)  # before the write
                else:
                    group.read_positions = group.positions
            else:
                group.kept = length
                group.slots = columns
                group.read_positions = group.positions
            group.positions.index_copy_(1, group.slots, positions[:, length - group.kept :])
        self.cursor.add_(length)

    # -- beam search and bookkeeping ------------------------------------------------------

    def reorder(self, rows: Tensor) -> None:
        """Row ``i`` becomes a copy of row ``rows[i]`` (beam search keeps the best beams)."""
        for layer in self._layers.values():
            layer.keys.copy_(layer.keys.index_select(0, rows))
            layer.values.copy_(layer.values.index_select(0, rows))
        for group in self._groups:
            group.positions.copy_(group.positions.index_select(0, rows))
        for states in self._states.values():
            for state in states.values():
                state.copy_(state.index_select(0, rows))

    def rollback(self, columns: int) -> None:
        """Keep only the first ``columns`` columns written (speculative decoding drops rejected drafts).

        The dropped slots are marked empty, so nothing attends to them, and the next forward
        writes from column ``columns`` on. A ring layer can only give back what its ``spare``
        slots kept: dropping more columns than ``spare`` is an error (its older keys are gone).
        A recurrent state goes back to the state after column ``columns - 1``, which must be
        one of the last ``spare`` columns written while :attr:`keep_steps` was set.
        """
        written = int(self.cursor)
        if not 0 <= columns <= written:
            raise ValueError(f"rollback to column {columns}: only {written} columns are written")
        if columns == written:
            return
        if self._states:
            self._rollback_states(columns, written)
        if written - columns > self.spare and any(group.ring for group in self._groups):
            raise ValueError(f"rollback by {written - columns} columns, but this cache's ring layers keep only "
                             f"{self.spare} spare slots; build it with spare={written - columns} or more")
        dropped = torch.arange(columns, written, device=self.cursor.device)  # (D,)
        for group in self._groups:
            slots = dropped % group.size if group.ring else dropped
            group.positions.index_fill_(1, slots, -1)
        self.cursor.fill_(columns)

    def _rollback_states(self, columns: int, written: int) -> None:
        """Each recurrent state as it was after column ``columns - 1``, from the segment that holds that column."""
        segment = next((s for s in reversed(self._segments) if s.start <= columns <= s.start + s.length), None)
        complete = segment is not None and all(set(segment.after.get(index, ())) == set(held)
                                                for index, held in self._states.items())
        if segment is None or not complete:
            raise ValueError(f"rollback to column {columns} of a cache with recurrent states: only the columns of the last "
                             f"{self.spare} spare ones written with keep_steps set can be returned to")
        for index, held in self._states.items():
            for name, state in held.items():
                offset = columns - segment.start
                state.copy_(segment.before[index][name] if offset == 0 else segment.after[index][name][:, offset - 1])
        # What lies past ``columns`` is gone: later segments are dropped, the one holding it ends there.
        self._segments = [s for s in self._segments if s.start < columns]
        for kept in self._segments:
            kept.length = min(kept.length, columns - kept.start)

    def reset(self) -> None:
        """Forget everything written; the buffers stay allocated."""
        self.cursor.zero_()
        for group in self._groups:
            group.positions.fill_(-1)
        for states in self._states.values():
            for state in states.values():
                state.zero_()
        self._segments.clear()

    @property
    def length(self) -> int:
        """Columns written so far (reads the device counter: a sync, not for the decode loop)."""
        return int(self.cursor)

    @property
    def nbytes(self) -> int:
        """Memory held by keys, values, slot positions and recurrent states."""
        tensors = [t for layer in self._layers.values() for t in (layer.keys, layer.values)]
        tensors += [t for states in self._states.values() for t in states.values()]
        tensors += [group.positions for group in self._groups]
        return sum(t.numel() * t.element_size() for t in tensors)

    def slot_counts(self) -> dict[int, int]:
        """Buffer length of every layer (``capacity``, or the window for ring layers)."""
        return {index: layer.group.size for index, layer in sorted(self._layers.items())}
