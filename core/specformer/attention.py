"""What other code may know about an attention layer: its heads and what it caches.

An attention component is free inside (its projections, its kernel, its norms), but
some of its facts are read from outside: the positional scheme is sized by its heads,
a KV cache (generate) allocates keys and values by its kv heads, head size and
window, ``summary`` counts its FLOPs and cache bytes, and the hf plugin maps its heads
to a config. Those facts are declared here, once, as :class:`AttentionLayer`, like
:class:`~specformer.context.KVCache` and :class:`~specformer.positional.PositionalScheme`.

Two of them have defaults derived from others (``n_kv_heads`` defaults to ``n_heads``,
``head_dim`` to ``d_model / n_heads``); :func:`head_sizes` is the one place that derives
them, for the layer itself and for anyone reading a spec without building it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@runtime_checkable
class AttentionLayer(Protocol):
    """The public facts of a self-attention sublayer (``Decoder.attention_modules()`` returns these).

    What it caches: keys and values of shape ``(B, n_kv_heads, S, head_dim)``, written
    through ``ctx.cache.update(layer_index, ...)``; ``S`` need never exceed ``window``
    when the layer has one (it attends to at most the ``window`` latest tokens).
    """

    n_heads: int  # query heads
    n_kv_heads: int  # key/value heads (equal to n_heads: multi-head; 1: multi-query)
    head_dim: int  # channels per head
    window: int | None  # sliding window in tokens, or None for full causal attention
    layer_index: int  # the layer whose keys and values this layer caches


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


__all__ = ["AttentionLayer", "HeadSizes", "head_sizes"]
