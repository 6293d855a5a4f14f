"""What other code may know about an attention layer: its heads and what it caches.

An attention component is free inside (its projections, its kernel, its norms), but
some of its facts are read from outside: the positional scheme is sized by its heads,
a KV cache (generate) allocates keys and values by its kv heads, head size and
window, ``summary`` counts its FLOPs and cache bytes, and the hf plugin maps its heads
to a config. Those facts are declared here, once, as :class:`AttentionLayer`, like
:class:`~specformer.model.context.KVCache` and :class:`~specformer.model.positional.PositionalScheme`.

Two of them have defaults derived from others (``n_kv_heads`` defaults to ``n_heads``,
``head_dim`` to ``d_model / n_heads``); :func:`head_sizes` is the one place that derives
them, for the layer itself and for anyone reading a spec without building it.

What a layer keeps per token in a generation cache is its own business too: it declares
it as :class:`CacheSlots` (two tensors, "keys" and "values", each with its own head count
and width: full keys and values, or a compressed latent and a shared rotary key as in
latent attention), or ``None`` when it keeps nothing. The generate plugin lays its cache
out from those declarations only, so a third-party attention needs no change there.

A layer may read another layer's keys and values instead of keeping its own (cross-layer
KV sharing, as Gemma 4's last layers do): it declares ``kv_from``, the index of an earlier
layer, and keeps nothing (``cache_slots`` None). Within one forward the source layer hands
what it attended to (after its cache update, so the cache's contents too) to the layers
that read it through :attr:`~specformer.model.context.ForwardContext.shared_kv`; a cache
therefore lays out nothing for a sharing layer, and every count of cache bytes counts it
as costing nothing. :func:`kv_source_of` reads the declaration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class CacheSlots:
    """What one attention layer keeps per token between forward passes.

    Two tensors per layer, written with ``ctx.cache.update(layer_index, key, value, positions)``:
    ``key`` ``(B, key_heads, T, key_dim)`` and ``value`` ``(B, value_heads, T, value_dim)``.
    They need not be keys and values: latent attention (DeepSeek-V2) stores its shared
    rotary key as ``key`` ``(B, 1, T, qk_rope_head_dim)`` and its compressed latent as
    ``value`` ``(B, 1, T, kv_lora_rank)``.
    """

    key_heads: int
    key_dim: int
    value_heads: int
    value_dim: int

    @property
    def elements_per_token(self) -> int:
        return self.key_heads * self.key_dim + self.value_heads * self.value_dim

    def bytes_per_token(self, element_size: int) -> int:
        """Bytes one token takes in this layer's cache, for elements of ``element_size`` bytes."""
        return self.elements_per_token * element_size


@runtime_checkable
class AttentionLayer(Protocol):
    """The public facts of a self-attention sublayer (``Decoder.attention_modules()`` returns these).

    What it caches: by default keys and values of shape ``(B, n_kv_heads, S, head_dim)``,
    written through ``ctx.cache.update(layer_index, ...)``; a layer that keeps something
    else declares ``cache_slots`` (a :class:`CacheSlots`, or None for nothing; read it
    with :func:`cache_slots_of`). ``S`` need never exceed ``window`` when the layer has
    one (it attends to at most the ``window`` latest tokens), nor ``chunk`` when it declares
    one (chunked local attention reads only its own chunk: see :func:`reach_of`). The positional scheme of
    the layer is sized by ``n_heads`` and by ``positional_dim`` when the layer declares
    one (the channels per head a rotary scheme turns; default ``head_dim``; see
    :func:`positional_dim_of`). A sparse attention (an indexer choosing keys) may declare
    ``keys_read`` (the most keys one query reads) and ``selection_flops_per_key`` (what
    choosing costs per query and key of its span), which ``specformer summary`` counts.

    A token mixer that is no attention (a recurrence, a convolution) declares only what it
    has: ``layer_index``, its ``state_slots`` and its heads where it has heads; readers take
    the rest from :func:`heads_of`, :func:`cache_slots_of`, :func:`reach_of` and
    :func:`specformer.model.state.uses_positions`, which answer "none" for what is not declared.
    """

    n_heads: int  # query heads
    n_kv_heads: int  # key/value heads (equal to n_heads: multi-head; 1: multi-query)
    head_dim: int  # channels per head
    window: int | None  # sliding window in tokens, or None for full causal attention
    layer_index: int  # the layer whose keys and values this layer caches
    # Optional: ``kv_from`` (int), the earlier layer whose keys and values this one reads; see kv_source_of.


@dataclass(frozen=True)
class HeadSizes:
    """The head sizes of an attention layer, every default resolved."""

    n_heads: int
    n_kv_heads: int
    head_dim: int


def head_sizes(*, d_model: int, n_heads: int, n_kv_heads: int | None = None, head_dim: int | None = None) -> HeadSizes:
    """Resolve the derived defaults: ``n_kv_heads`` -> ``n_heads``, ``head_dim`` -> ``d_model / n_heads``.

    ValueError naming the sizes when they do not fit (``n_kv_heads`` must divide
    ``n_heads``; ``n_heads`` must divide ``d_model`` unless ``head_dim`` is given).
    """
    kv = n_kv_heads or n_heads
    if n_heads % kv:
        raise ValueError(f"n_kv_heads ({kv}) must divide n_heads ({n_heads})")
    if head_dim is None:
        if d_model % n_heads:
            raise ValueError(f"n_heads ({n_heads}) must divide d_model ({d_model}) unless head_dim is given")
        head_dim = d_model // n_heads
    return HeadSizes(n_heads=n_heads, n_kv_heads=kv, head_dim=head_dim)


def heads_of(layer: Any) -> HeadSizes | None:
    """``layer``'s heads as it declares them (``n_heads`` and ``head_dim``; ``n_kv_heads`` defaulting to ``n_heads``), or None.

    A mixer declares heads only where it has them: a short convolution or a per-channel
    recurrence has none, and then nothing is sized by them.
    """
    n_heads, head_dim = getattr(layer, "n_heads", None), getattr(layer, "head_dim", None)
    if n_heads is None or head_dim is None:
        return None
    kv = getattr(layer, "n_kv_heads", None)
    return HeadSizes(n_heads=int(n_heads), n_kv_heads=int(n_heads if kv is None else kv), head_dim=int(head_dim))


def cache_slots_of(layer: Any) -> CacheSlots | None:
    """What ``layer`` keeps per token: its declared ``cache_slots``, else keys and values by its kv heads.

    A layer written before ``cache_slots`` existed keeps keys and values
    ``(B, n_kv_heads, S, head_dim)``; that stays its default. A mixer that keeps a recurrent
    state instead (it declares ``state_slots``) or has no heads keeps nothing per token unless
    it says so.
    """
    if hasattr(layer, "cache_slots"):
        return layer.cache_slots
    kv = getattr(layer, "n_kv_heads", None)
    kv = getattr(layer, "n_heads", None) if kv is None else kv
    hd = getattr(layer, "head_dim", None)
    if kv is None or hd is None or getattr(layer, "state_slots", None) is not None:
        return None
    return CacheSlots(key_heads=int(kv), key_dim=int(hd), value_heads=int(kv), value_dim=int(hd))


def reach_of(layer: Any) -> int | None:
    """How many of the latest tokens ``layer`` ever reads: its ``window``, or its ``chunk`` (a chunked layer reads
    only the tokens of its own chunk, never more than ``chunk`` back), the smaller of the two; None: every token.

    What a cache must keep for it (a ring of this many slots) and what its attention costs per token at most.
    """
    spans = [s for s in (getattr(layer, "window", None), getattr(layer, "chunk", None)) if s is not None]
    return min(spans) if spans else None


def kv_source_of(layer: Any) -> int | None:
    """The earlier layer whose keys and values ``layer`` reads (its ``kv_from``), or None when it has its own."""
    source = getattr(layer, "kv_from", None)
    return None if source is None else int(source)


def positional_dim_of(layer: Any) -> int:
    """Channels per head a positional scheme acts on: ``positional_dim`` when declared, else ``head_dim``."""
    dim = getattr(layer, "positional_dim", None)
    return int(dim if dim is not None else layer.head_dim)


__all__ = ["AttentionLayer", "CacheSlots", "HeadSizes", "cache_slots_of", "head_sizes", "heads_of", "kv_source_of",
           "positional_dim_of", "reach_of"]
