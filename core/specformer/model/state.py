"""What a recurrent token mixer keeps between forward passes: a fixed-size state per sequence.

Softmax attention keeps something per *token* (:class:`~specformer.model.attention.CacheSlots`),
so its cache grows with the context. A recurrent mixer (Gated DeltaNet, Kimi Delta
Attention, Mamba-2, a short convolution) folds the past into a state of fixed size: a
window of its last inputs for the causal convolution, and a matrix for the recurrence.
It declares that state as :class:`StateSlots` (named tensors and their shapes for one
sequence) and leaves ``cache_slots`` at ``None``. A cache lays out one state per row from
those declarations only, so a third-party mixer needs no change in the generate or serve
plugins.

During a cached forward a mixer reads the state its rows had before this forward and
writes the state after it::

    state = ctx.cache.read_state(self.layer_index, ctx.positions)   # {"conv": (B, C, K-1), ...}
    ... run the tokens ...
    ctx.cache.write_state(self.layer_index, {"conv": conv, "recurrent": s}, steps=...)

Beside ``state_slots`` a mixer declares ``uses_positions = False`` (a recurrence is ordered
by itself, so the model's positional scheme is sized by the layers that read positions),
and may declare ``recurrent_flops_per_token`` (what its recurrence costs per token beyond
its weight matmuls, for ``specformer summary``) and ``describe_kernel()`` (what it runs).

Two promises make every consumer of the cache exact:

- **Padding never enters a state.** A token whose position is negative (left padding of a
  ragged batch, a serve row with fewer new tokens) leaves the state as it was.
- **Steps, when asked.** When ``cache.keep_steps`` is true (speculative decoding's
  verification pass), the mixer also hands over the state after each of the forward's
  tokens, ``steps={name: (B, T, *shape)}``, so the cache can roll back to any of them
  exactly (:meth:`RecurrentStateCache.write_state`).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from specformer.model.attention import heads_of

if TYPE_CHECKING:  # torch-free at run time: the size check (specformer.model.wiring) reads uses_positions
    from torch import Tensor


@dataclass(frozen=True)
class StateSlots:
    """The named tensors one recurrent layer keeps per sequence, each of a fixed shape (batch excluded).

    ``StateSlots((("conv", (C, K - 1)), ("recurrent", (H, dk, dv))))``: a cache holds
    ``(B, C, K - 1)`` and ``(B, H, dk, dv)`` for it, whatever the context.

    ``per_tokens`` names tensors whose first axis holds one row per that many tokens (the
    pooled entries of compressed attention, one per block): their declared rows cover the
    model's context, and a cache that knows how many tokens it will hold keeps only
    ``ceil(tokens / per)`` rows of them (:meth:`shapes_for`).
    """

    tensors: tuple[tuple[str, tuple[int, ...]], ...]
    per_tokens: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        names = [name for name, _ in self.tensors]
        if len(set(names)) != len(names):
            raise ValueError(f"state tensor names must differ, got {names}")
        for name, shape in self.tensors:
            if not all(isinstance(n, int) and n >= 1 for n in shape):
                raise ValueError(f"state tensor {name!r} needs positive integer sizes, got {shape}")
        for name, per in self.per_tokens:
            if name not in names or not (isinstance(per, int) and per >= 1):
                raise ValueError(f"per_tokens names a declared tensor and a positive token count, got {name!r}: {per!r}")

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return dict(self.tensors)

    def shapes_for(self, tokens: int | None = None) -> dict[str, tuple[int, ...]]:
        """The shapes a cache holding at most ``tokens`` tokens needs (None: the declared ones, for the whole context)."""
        shapes = self.shapes
        if tokens is not None:
            for name, per in self.per_tokens:
                rows, *rest = shapes[name]
                shapes[name] = (max(1, min(rows, -(-tokens // per))), *rest)
        return shapes

    @property
    def elements_per_sequence(self) -> int:
        return sum(prod(shape) for _, shape in self.tensors)

    def bytes_per_sequence(self, element_size: int, tokens: int | None = None) -> int:
        """Bytes one sequence's state takes in this layer, for elements of ``element_size`` bytes, up to ``tokens`` tokens."""
        return sum(prod(shape) for shape in self.shapes_for(tokens).values()) * element_size


@runtime_checkable
class RecurrentStateCache(Protocol):
    """A cache that also keeps recurrent states (the generate plugin's static cache, the serve plugin's paged one).

    ``read_state`` returns, for each state tensor the layer declared, the state of every
    row before this forward ``(B, *shape)`` (zeros for a fresh row); ``positions``
    ``(B, T)`` are this forward's, so a cache whose first layer is recurrent learns from
    it where the forward's tokens go. ``write_state`` stores the state after the forward
    (same shapes), and, when :attr:`keep_steps` is set, ``steps``: the state after each
    token ``(B, T, *shape)`` (for a padding token, the state before it).
    """

    keep_steps: bool

    def read_state(self, layer_index: int, positions: Tensor) -> dict[str, Tensor]: ...

    def write_state(self, layer_index: int, states: dict[str, Tensor], *, steps: dict[str, Tensor] | None = None) -> None: ...


def state_slots_of(layer: Any) -> StateSlots | None:
    """What ``layer`` keeps per sequence (its declared ``state_slots``), or None: it keeps nothing of fixed size."""
    return getattr(layer, "state_slots", None)


def uses_positions(layer: Any) -> bool:
    """Whether a token mixer reads positions (softmax attention does; a recurrence is ordered by itself).

    A layer that says nothing reads positions when it has heads and keeps no recurrent state
    (softmax attention); one that keeps a state and still reads positions (a sliding window
    beside a pooled state) declares ``uses_positions = True``. The model's scheme is sized by
    the layers that use one.
    """
    declared = getattr(layer, "uses_positions", None)
    if declared is not None:
        return bool(declared)
    return heads_of(layer) is not None and state_slots_of(layer) is None


def recurrent_cache(cache: Any, layer: Any) -> RecurrentStateCache:
    """``cache`` as a :class:`RecurrentStateCache`; TypeError naming the layer when it keeps no states."""
    if not callable(getattr(cache, "read_state", None)) or not callable(getattr(cache, "write_state", None)):
        raise TypeError(f"layer {getattr(layer, 'layer_index', '?')} ({type(layer).__name__}) keeps a recurrent state, "
                        f"but the cache {type(cache).__name__} has no read_state/write_state "
                        f"(see specformer.model.state.RecurrentStateCache)")
    return cache


__all__ = ["RecurrentStateCache", "StateSlots", "recurrent_cache", "state_slots_of", "uses_positions"]
