"""The contract between a positional scheme, the Decoder and attention.

A scheme can act in three places, and implements the ones it needs:

* ``embed(positions)``: a tensor added to the token embeddings (learned, sinusoidal);
* ``rotate(x, state)``: a transform of queries and keys inside attention (RoPE);
* ``attention_bias(q_positions, k_positions, state)``: an additive bias on the
  attention scores (ALiBi).

``prepare(positions)`` runs once per forward and its result (``state``) is handed to
every layer, so per-position tables (RoPE's cos/sin) are computed once, not per layer.
Positions are absolute token positions ``(B, T)``; a negative position marks padding.

A scheme that acts inside attention (``rotate``, ``attention_bias``) may differ from
layer to layer (``model.layers[].positional``); one that adds to the embeddings is
model-level only (:func:`adds_to_embeddings`). The Decoder prepares each distinct scheme
once per forward and attention reads its own through ``ctx.positional_for(layer_index)``
and ``ctx.positional_state_for(layer_index)``.

``extrapolates`` says what happens past ``context_length`` (generation reads it):
"yes" (ALiBi, NoPE, RoPE with dynamic scaling), "warn" (plain RoPE: it runs, but the
model never saw such angles), "no" (learned or sinusoidal positions added to the
embeddings: refused). ``restart_cache_at`` is a length at which keys cached before it
become stale (LongRoPE switches factors there): generation re-encodes the sequence
once it reaches that many columns, as transformers' Phi-3 does.
"""

from __future__ import annotations

from typing import Any, Literal

from torch import Tensor, nn


class PositionalScheme(nn.Module):
    """Base class: by default a scheme adds nothing and changes nothing."""

    #: Past ``context_length``: "yes" runs as is, "warn" runs with a warning, "no" refuses.
    extrapolates: Literal["yes", "warn", "no"] = "yes"
    #: Columns after which keys cached earlier are stale (generation re-encodes once there); None: never.
    restart_cache_at: int | None = None

    def embed(self, positions: Tensor) -> Tensor | None:
        """``(B, T, d_model)`` to add to the token embeddings, or None."""
        return None

    def prepare(self, positions: Tensor) -> Any:
        """Per-forward state shared by all layers (computed once)."""
        return None

    def rotate(self, x: Tensor, state: Any) -> Tensor:
        """Queries or keys ``(B, H, T, head_dim)`` as attention should see them."""
        return x

    def attention_bias(self, q_positions: Tensor, k_positions: Tensor, state: Any) -> Tensor | None:
        """An additive score bias ``(B or 1, H, Tq, Tk)`` or None."""
        return None


def adds_to_embeddings(scheme: PositionalScheme) -> bool:
    """True when ``scheme`` implements ``embed`` (so it belongs to the model, not to one layer)."""
    return type(scheme).embed is not PositionalScheme.embed
