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

A feed-forward may keep a state too (RWKV's channel mixing keeps the previous token's input
for its token shift): it declares ``state_slots`` and ``layer_index`` the same way and reads
and writes with ``part="ffn"``. A layer's state is then the union of both
(:func:`layer_state_slots`): the mixer's tensors under their own names, the feed-forward's
prefixed ``ffn.``, so a cache keeps one set of tensors per layer as before and hands each
part its own names (:func:`part_names`).
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

    ``part`` names which of the layer's parts asks (:data:`STATE_PARTS`): the mixer (the
    default, which a mixer need not pass) or the feed-forward; each sees its own names only.
    """

    keep_steps: bool

    def read_state(self, layer_index: int, positions: Tensor, *, part: str = "mixer") -> dict[str, Tensor]: ...

    def write_state(self, layer_index: int, states: dict[str, Tensor], *, steps: dict[str, Tensor] | None = None,
                    part: str = "mixer") -> None: ...


#: The parts of a block that may keep a state, in the order a forward runs them, and the prefix their
#: names take in the layer's state (the mixer's keep their own names: a mixer-only layer is as before).
STATE_PARTS: tuple[tuple[str, str], ...] = (("mixer", ""), ("ffn", "ffn."))


def state_slots_of(layer: Any) -> StateSlots | None:
    """What ``layer`` keeps per sequence (its declared ``state_slots``), or None: it keeps nothing of fixed size."""
    return getattr(layer, "state_slots", None)


def layer_state_slots(block: Any) -> StateSlots | None:
    """What one layer keeps per sequence: its mixer's state, then its feed-forward's with names prefixed ``ffn.``.

    None when neither keeps a state. A mixer whose own names start with another part's prefix
    is refused (the two would be told apart by that prefix).
    """
    tensors: list[tuple[str, tuple[int, ...]]] = []
    per_tokens: list[tuple[str, int]] = []
    for part, prefix in STATE_PARTS:
        slots = state_slots_of(getattr(block, part, None))
        if slots is None:
            continue
        for name, shape in slots.tensors:
            if part == "mixer" and any(p and name.startswith(p) for _, p in STATE_PARTS):
                raise ValueError(f"a mixer's state tensor may not be named {name!r}: that prefix marks another part's "
                                 f"state ({', '.join(p for _, p in STATE_PARTS if p)})")
            tensors.append((prefix + name, shape))
        per_tokens += [(prefix + name, per) for name, per in slots.per_tokens]
    return StateSlots(tuple(tensors), per_tokens=tuple(per_tokens)) if tensors else None


def layer_states(model: Any) -> list[StateSlots | None]:
    """What each layer of ``model`` keeps per sequence (:func:`layer_state_slots`), None for a layer keeping nothing.

    Aligned with ``model.attention_modules()``. A model that shows only its mixers (a wrapper
    around a Decoder, a test double: no ``blocks``) has each mixer stand for its layer.
    """
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        return [state_slots_of(mixer) for mixer in model.attention_modules()]
    # A Decoder with shared blocks lists one entry per use after its layers (layer_blocks).
    return [layer_state_slots(block) for block in (model.layer_blocks() if hasattr(model, "layer_blocks") else blocks)]


def states_by_layer(model: Any) -> list[tuple[int, StateSlots]]:
    """``(layer index, state)`` of every layer of ``model`` that keeps a state (:func:`layer_states`), in order."""
    mixers = model.attention_modules()
    return [(int(getattr(mixer, "layer_index", index)), slots)
            for index, (mixer, slots) in enumerate(zip(mixers, layer_states(model))) if slots is not None]


def part_names(names: Any, part: str) -> dict[str, str]:
    """Of a layer's state names, ``part``'s: ``{its own name: the name in the layer's state}``."""
    prefixes = dict(STATE_PARTS)
    if part not in prefixes:
        raise ValueError(f"state part {part!r} is not one of {sorted(prefixes)}")
    prefix = prefixes[part]
    others = [p for q, p in STATE_PARTS if q != part and p]
    return {name[len(prefix):]: name for name in names
            if name.startswith(prefix) and not any(name.startswith(p) for p in others)}


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


__all__ = ["RecurrentStateCache", "STATE_PARTS", "StateSlots", "layer_state_slots", "layer_states", "states_by_layer", "part_names",
           "recurrent_cache", "state_slots_of", "uses_positions"]
