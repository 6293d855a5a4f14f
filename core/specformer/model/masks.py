"""Which keys each query may attend to: one rule, evaluated densely, per tile or per score.

An attention layer's mask is the conjunction of a few facts, all decided here and
nowhere else:

* **causal**: a key comes no later than its query. Without a cache (training, a
  prompt run whole) "later" is the token's *column* in its row, not its position
  value, so positions that restart per document can never reach a later token;
  with a cache, keys carry the absolute positions the cache stored and the query's
  position decides.
* **padding**: a key at a negative position is never read; a padding query (negative
  position) may read everything, so its row stays finite (its output is never used).
* **window** ``w``: the query reads at most the ``w`` latest keys (Mistral).
* **chunk** ``c``: the query reads only keys in its own block of ``c`` positions,
  ``position // c`` equal (Llama 4's local layers).
* **documents**: with ``document_ids`` ``(B, T)`` a query reads only keys of its own
  document (packed training).

:func:`allowed` is that rule as one elementwise expression over broadcastable
tensors. The dense form (:func:`dense_mask`) broadcasts it to ``(B, 1, Tq, S)``;
:func:`block_summary` evaluates it one tile of queries at a time and keeps only, per
``block x block`` tile, whether any and whether every pair is allowed (what a sparse
kernel needs), so no ``Tq x S`` tensor is ever made; a kernel that visits single
scores (FlexAttention's ``mask_mod``) gathers the same inputs by index and calls
:func:`allowed` on scalars.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class MaskRule:
    """The per-layer part of a mask: a sliding window and/or a chunk size (None: not limited)."""

    window: int | None = None
    chunk: int | None = None


@dataclass(frozen=True)
class MaskInputs:
    """The per-forward part of a mask, for one set of keys.

    ``q_order``/``k_order`` decide causality and windows (negative: padding);
    ``q_positions``/``k_positions`` decide chunks; ``q_documents``/``k_documents``
    (or None) decide documents.
    """

    q_order: Tensor  # (B, Tq)
    k_order: Tensor  # (B, S)
    q_positions: Tensor  # (B, Tq)
    k_positions: Tensor  # (B, S)
    q_documents: Tensor | None = None  # (B, Tq)
    k_documents: Tensor | None = None  # (B, S)


def mask_inputs(
    q_positions: Tensor, k_positions: Tensor, *, document_ids: Tensor | None = None, same_tokens: bool = False
) -> MaskInputs:
    """The mask inputs of queries at ``q_positions`` reading keys at ``k_positions``.

    ``same_tokens``: the keys are this forward's own tokens (no cache), so causality is
    by column and documents apply to both sides. ``document_ids`` need ``same_tokens``.
    """
    if not same_tokens:
        if document_ids is not None:
            raise ValueError("document_ids apply to a forward without a cache (the keys must be the same tokens)")
        return MaskInputs(q_positions, k_positions, q_positions, k_positions)
    batch, length = q_positions.shape
    column = torch.arange(length, device=q_positions.device).expand(batch, length)  # (B, T)
    order = torch.where(q_positions >= 0, column, -1)  # padding keeps its mark
    return MaskInputs(order, order, q_positions, q_positions, document_ids, document_ids)


def allowed(
    q_order: Tensor,
    k_order: Tensor,
    q_positions: Tensor,
    k_positions: Tensor,
    q_documents: Tensor | None,
    k_documents: Tensor | None,
    rule: MaskRule,
) -> Tensor:
    """True where a query may read a key; every argument broadcasts against the others."""
    ok = (k_order <= q_order) & (k_order >= 0)
    if rule.window is not None:
        ok = ok & ((q_order - k_order) < rule.window)
    if rule.chunk is not None:
        ok = ok & (torch.div(q_positions, rule.chunk, rounding_mode="floor")
                   == torch.div(k_positions, rule.chunk, rounding_mode="floor"))
    if q_documents is not None:
        ok = ok & (q_documents == k_documents)
    return ok | (q_order < 0)


def dense_mask(inputs: MaskInputs, rule: MaskRule, *, rows: slice = slice(None)) -> Tensor:
    """Boolean ``(B, 1, Tq, S)`` (or the query ``rows`` given): True where a query may read a key."""

    def q(t: Tensor | None) -> Tensor | None:
        return None if t is None else t[:, rows][:, None, :, None]  # (B, 1, Tq, 1)

    def k(t: Tensor | None) -> Tensor | None:
        return None if t is None else t[:, None, None, :]  # (B, 1, 1, S)

    return allowed(q(inputs.q_order), k(inputs.k_order), q(inputs.q_positions), k(inputs.k_positions),
                   q(inputs.q_documents), k(inputs.k_documents), rule)


def block_summary(inputs: MaskInputs, rule: MaskRule, *, block: int) -> tuple[Tensor, Tensor]:
    """Per ``block x block`` tile: ``(any, every)`` bool ``(B, n_q_blocks, n_k_blocks)``.

    ``any`` marks tiles with at least one allowed pair, ``every`` tiles whose pairs are
    all allowed (keys past ``S`` count as not allowed, so a ragged last tile is never
    "every"). Built one row of tiles at a time: the largest tensor is ``block x S``.
    """
    batch, n_q = inputs.q_order.shape
    n_k = inputs.k_order.shape[1]
    q_blocks, k_blocks = -(-n_q // block), -(-n_k // block)
    pad = k_blocks * block - n_k
    any_rows, every_rows = [], []
    for i in range(q_blocks):
        tile = dense_mask(inputs, rule, rows=slice(i * block, (i + 1) * block))[:, 0]  # (B, rows, S)
        if pad:
            tile = torch.nn.functional.pad(tile, (0, pad), value=False)
        tile = tile.view(batch, tile.shape[1], k_blocks, block)  # (B, rows, n_k_blocks, block)
        any_rows.append(tile.any(dim=3).any(dim=1))
        every_rows.append(tile.all(dim=3).all(dim=1))
    return torch.stack(any_rows, dim=1), torch.stack(every_rows, dim=1)  # (B, n_q_blocks, n_k_blocks)


def check_document_ids(document_ids: Tensor, input_ids: Tensor, *, cache: object = None) -> None:
    """ValueError naming what is wrong unless ``document_ids`` fits a forward of ``input_ids``."""
    if cache is not None:
        raise ValueError("document_ids are for a forward without a cache (packed training); generation has one document")
    if tuple(document_ids.shape) != tuple(input_ids.shape):
        raise ValueError(f"document_ids must have the shape of input_ids {tuple(input_ids.shape)}, "
                         f"got {tuple(document_ids.shape)}")
    if document_ids.dtype.is_floating_point or document_ids.dtype.is_complex or document_ids.dtype == torch.bool:
        raise ValueError(f"document_ids must be an integer tensor, got {document_ids.dtype}")
    if document_ids.device != input_ids.device:
        raise ValueError(f"document_ids are on {document_ids.device}, input_ids on {input_ids.device}")


def causal_mask(q_positions: Tensor, k_positions: Tensor, *, window: int | None = None) -> Tensor:
    """Boolean ``(B, 1, Tq, Tk)`` by positions alone (keys read from a cache)."""
    return dense_mask(mask_inputs(q_positions, k_positions), MaskRule(window=window))


__all__ = ["MaskInputs", "MaskRule", "allowed", "block_summary", "causal_mask", "check_document_ids", "dense_mask",
           "mask_inputs"]
