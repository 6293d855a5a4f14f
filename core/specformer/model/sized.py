"""What a component's size check answers, without building it: :class:`Sized`.

The builder passes each component the sizes of its kind (``d_model``, ``dim``, ...; see
:data:`~specformer.registry.components.KINDS`). Whether those sizes fit the component's
params (``n_heads`` must divide ``d_model``, a rotary width must be even, ``top_k`` at most
``n_experts``) is known before any tensor exists, so a component may declare it on its
torch-free ``Params``::

    class MyAttentionParams(Params):
        n_heads: int = Field(gt=0)

        def sized(self, *, d_model: int) -> Sized:
            if d_model % self.n_heads:
                raise ValueError(f"n_heads ({self.n_heads}) must divide d_model ({d_model})")
            head_dim = d_model // self.n_heads
            return Sized(parameters=4 * d_model * d_model, n_heads=self.n_heads, head_dim=head_dim)

``sized`` takes the sizes its constructor takes (only those it names are passed), raises
``ValueError`` with the message its constructor would raise, and returns the facts the
builder reads from the built module (see the fields below). ``specformer validate`` and
:func:`specformer.load_spec` run these checks instead of building, so they never import
torch; a contract test (tests/core/spec/test_size_checks.py) holds every registered
component's check to what its constructor accepts.

A component that declares nothing (``Params.sized`` returns ``NotImplemented``) still
validates: its module is built on the meta device and the facts are read from it (torch
is then imported, for that spec only).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from specformer.model.attention import CacheSlots


@dataclass(frozen=True)
class Sized:
    """The facts of one component for given sizes, as the built module would show them.

    Every field is optional: declare those your kind's readers use. A token mixer declares
    only the facts it has: an attention its ``n_heads``, ``head_dim`` and, when they differ from
    the defaults, ``n_kv_heads``, ``positional_dim``, ``slots`` (what it caches when not keys and
    values by its heads), ``kv_from`` and ``window``; a recurrence ``keeps_state`` (and its heads
    where it has heads); ``uses_positions`` and ``caches_tokens`` follow from those unless declared; the per-layer input part gives its ``width`` and a layout
    that takes it its ``per_layer_width``; a positional scheme that adds
    to the token embeddings sets ``adds_to_embeddings``; a sublayer that is not there (the
    ``none`` attention and ffn) sets ``absent``; a residual stream gives ``n_streams`` and the
    ``connection`` each block place gets (which a layout's check receives from ``make_residual()``).
    """

    #: Parameter elements of the module as built, its sub-parts included (``sum(p.numel() for p in
    #: module.parameters())``); None when not declared (validate then skips the 2^63-byte check).
    parameters: int | None = None
    n_heads: int | None = None
    n_kv_heads: int | None = None
    head_dim: int | None = None
    #: Channels per head a positional scheme turns (latent attention's rotary part); None: head_dim.
    positional_dim: int | None = None
    #: Whether a mixer reads positions; None (undeclared): it does when it has heads and keeps no recurrent
    #: state (as :func:`~specformer.model.state.uses_positions` reads a module). The model's scheme is
    #: sized by the mixers that read positions.
    uses_positions: bool | None = None
    #: Whether a mixer keeps something per token in a generation cache; None (undeclared): it does when
    #: it declares ``slots``, or has heads and keeps no recurrent state (as
    #: :func:`~specformer.model.attention.cache_slots_of` reads a module).
    caches_tokens: bool | None = None
    #: What a mixer keeps per token when not keys and values of ``n_kv_heads`` x ``head_dim`` (its declared
    #: ``cache_slots``); read through :attr:`cache_slots`.
    slots: CacheSlots | None = None
    #: The earlier layer whose keys and values a mixer reads (cross-layer KV sharing), or None.
    kv_from: int | None = None
    #: How many of the latest tokens a mixer reads (a sliding window), or None: every token.
    window: int | None = None
    #: True for a mixer that keeps a fixed-size recurrent state (``state_slots``).
    keeps_state: bool = False
    #: True for a positional scheme that adds to the token embeddings (model-level only).
    adds_to_embeddings: bool = False
    #: True for a sublayer that is not there: a layout makes no norm that serves only it.
    absent: bool = False
    #: For a residual stream and each of its connections: how many parallel streams it holds.
    n_streams: int = 1
    #: For a residual stream: the facts of one connection it makes (``make_residual()`` in a layout);
    #: each place in each block gets its own, with these parameters.
    connection: "Sized | None" = field(default=None, repr=False)
    #: For the per-layer input part (``model.per_layer_input``): channels each block receives.
    width: int | None = None
    #: For a layout: the width of the per-layer input it takes (0: none).
    per_layer_width: int = 0
    #: The component's class name, for messages (filled in by the registry).
    name: str = ""
    #: Builds the component itself on the meta device (filled in by the registry; used by a
    #: sibling that declares no check and must be built around real modules).
    build: Callable[[], Any] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Resolve the undeclared facts the way the module readers do, so both answer alike.
        plain = self.n_heads is not None and not self.keeps_state
        if self.uses_positions is None:
            object.__setattr__(self, "uses_positions", plain)
        if self.caches_tokens is None:
            object.__setattr__(self, "caches_tokens", self.slots is not None or plain)

    @property
    def cache_slots(self) -> CacheSlots | None:
        """What the mixer keeps per token (as :func:`~specformer.model.attention.cache_slots_of` reads a module)."""
        if not self.caches_tokens:
            return None
        if self.slots is not None:
            return self.slots
        kv = self.n_kv_heads if self.n_kv_heads is not None else self.n_heads
        return CacheSlots(key_heads=int(kv), key_dim=int(self.head_dim), value_heads=int(kv),
                          value_dim=int(self.head_dim))


def total(*counts: int | None) -> int | None:
    """The sum of parameter counts, or None when any of them is unknown."""
    if any(c is None for c in counts):
        return None
    return sum(counts)  # type: ignore[arg-type]


def linear(d_in: int, d_out: int, *, bias: bool = False) -> int:
    """Parameter elements of a linear map ``d_in -> d_out`` (``nn.Linear``)."""
    return d_in * d_out + (d_out if bias else 0)


__all__ = ["Sized", "linear", "total"]
