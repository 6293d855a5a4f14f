"""The mask rule of :mod:`specformer.model.masks`, evaluated: one expression, dense or per tile.

The core keeps the rule as data (a layer's :class:`~specformer.model.masks.MaskRule`, the
forward's :class:`~specformer.model.context.ForwardContext`); the kernels next to this module
evaluate it, all through :func:`allowed`, so every kernel reads the same keys:

* :func:`attention_mask`: the dense boolean ``(B, 1, Tq, S)`` of one forward, built once
  per rule and key tensor and shared by every layer (the ``sdpa`` and ``eager`` kernels,
  and any attention of a third-party plugin);
* :func:`block_summary`: per ``block x block`` tile, whether any and whether every pair
  is allowed, one row of tiles at a time (FlexAttention's block mask, the tiled kernel's
  key ranges), so no ``Tq x S`` tensor is made;
* a kernel that visits single scores (FlexAttention's ``mask_mod``) gathers the same
  :class:`MaskInputs` by index and calls :func:`allowed` on scalars.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

from specformer.model.context import ForwardContext
from specformer.model.masks import MaskRule


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


def inputs_of(ctx: ForwardContext, k_positions: Tensor) -> MaskInputs:
    """The forward's queries reading keys at ``k_positions`` (its own tokens when that is ``ctx.positions``)."""
    return mask_inputs(ctx.positions, k_positions, document_ids=ctx.document_ids,
                       same_tokens=k_positions is ctx.positions)


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


def memo(ctx: ForwardContext, key: tuple, k_positions: Tensor, build: Callable[[MaskInputs], Any]) -> Any:
    """``build(inputs_of(ctx, k_positions))``, once per forward per ``key`` and key tensor.

    So every layer with the same rule shares one mask (dense, a block mask, tile spans),
    kept in ``ctx.masks``.
    """
    if torch.compiler.is_compiling():
        # Under torch.compile an id() becomes a guard on that very tensor, so every new
        # KV cache would recompile; the compiler deduplicates the repeated work itself.
        return build(inputs_of(ctx, k_positions))
    # The key tensor is kept alive beside its mask so its id cannot be reused this forward.
    full_key = (id(k_positions), *key)
    hit = ctx.masks.get(full_key)
    if hit is None:
        hit = (k_positions, build(inputs_of(ctx, k_positions)))
        ctx.masks[full_key] = hit
    return hit[1]


def attention_mask(ctx: ForwardContext, k_positions: Tensor, rule: MaskRule = MaskRule()) -> Tensor:
    """Boolean ``(B, 1, Tq, S)``: True where this forward's queries may read the keys at ``k_positions``.

    Keys no later than the query (by column without a cache, by position with one),
    within the rule's window and chunk, of the same document when ``ctx.document_ids``
    is set, never padding; padding queries read everything so their rows stay finite
    (their outputs are never used). Built once per forward per key tensor and rule.
    """
    return memo(ctx, ("dense", rule), k_positions, lambda inputs: dense_mask(inputs, rule))


def causal_mask(q_positions: Tensor, k_positions: Tensor, *, window: int | None = None) -> Tensor:
    """Boolean ``(B, 1, Tq, S)`` by positions alone (keys read from a cache)."""
    return dense_mask(mask_inputs(q_positions, k_positions), MaskRule(window=window))


__all__ = ["MaskInputs", "allowed", "attention_mask", "block_summary", "causal_mask", "dense_mask", "inputs_of",
           "mask_inputs", "memo"]
