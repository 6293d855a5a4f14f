"""Query tiles over the keys they can read: the dense kernels on ``tile x span`` pieces.

Where FlexAttention cannot run (PyTorch 2.13 has no CPU backward for it), attention
still need not build a ``T x T`` mask: the queries are cut into tiles of :data:`TILE`
rows, and each tile reads only the contiguous range of keys its rows may read (for a
window, about ``tile + window`` keys; for documents, its documents' keys; for plain
causal with a bias, the keys up to its last row). Each piece runs the dense kernel
(SDPA with the piece's mask and bias, or the eager softmax when soft-capped), so
values and gradients are those of the dense path, and the work and the memory of a
windowed layer grow linearly with T.

The key range of every tile comes from the block summary of the rule (one ``tile x S``
piece at a time), built once per forward per rule and shared by every layer.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from specformer.model.context import ForwardContext
from specformer.model.masks import MaskRule

from specformer_layers.attention.masking import MaskInputs, block_summary, dense_mask, inputs_of, memo

#: Query rows per tile (and the key granularity of each tile's range).
TILE = 256


def spans(ctx: ForwardContext, k_positions: Tensor, rule: MaskRule) -> list[tuple[int, int, int, int]]:
    """``(q0, q1, k0, k1)`` per tile: rows ``q0:q1`` read only keys ``k0:k1`` (any row of the batch)."""
    tile = TILE

    def build(inputs: MaskInputs) -> list[tuple[int, int, int, int]]:
        some, _ = block_summary(inputs, rule, block=tile)  # (B, n_q_tiles, n_k_tiles)
        some = some.any(dim=0)  # one range serves every row of the batch
        n_q, n_k = inputs.q_order.shape[1], inputs.k_order.shape[1]
        out = []
        for i, row in enumerate(some.tolist()):
            read = [j for j, hit in enumerate(row) if hit]
            k0, k1 = (read[0] * tile, min((read[-1] + 1) * tile, n_k)) if read else (0, 1)
            out.append((i * tile, min((i + 1) * tile, n_q), k0, k1))
        return out

    return memo(ctx, ("tiles", rule, tile), k_positions, build)


def covered(ctx: ForwardContext, k_positions: Tensor, rule: MaskRule) -> float:
    """The share of the ``Tq x S`` scores the tiles compute (1.0: no saving over the dense path)."""
    pieces = spans(ctx, k_positions, rule)
    area = sum((q1 - q0) * (k1 - k0) for q0, q1, k0, k1 in pieces)
    return area / max(1, pieces[-1][1] * k_positions.shape[1])


def tiled(q: Tensor, k: Tensor, v: Tensor, *, ctx: ForwardContext, k_positions: Tensor, rule: MaskRule,
          bias: Callable[[Tensor, Tensor], Tensor | None],
          kernel: Callable[..., Tensor]) -> Tensor:
    """Attention output ``(B, H, Tq, hd)``: ``kernel(q, k, v, mask=, bias=)`` on each tile and its key span."""
    inputs = inputs_of(ctx, k_positions)
    pieces = []
    for q0, q1, k0, k1 in spans(ctx, k_positions, rule):
        piece = _slice(inputs, slice(q0, q1), slice(k0, k1))
        mask = dense_mask(piece, rule)  # (B, 1, q1-q0, k1-k0)
        pieces.append(kernel(q[:, :, q0:q1], k[:, :, k0:k1], v[:, :, k0:k1], mask=mask,
                             bias=bias(ctx.positions[:, q0:q1], k_positions[:, k0:k1])))
    return torch.cat(pieces, dim=2)  # (B, H, Tq, hd)


def _slice(inputs: MaskInputs, rows: slice, cols: slice) -> MaskInputs:
    def q(t: Any) -> Any:
        return None if t is None else t[:, rows]

    def k(t: Any) -> Any:
        return None if t is None else t[:, cols]

    return MaskInputs(q(inputs.q_order), k(inputs.k_order), q(inputs.q_positions), k(inputs.k_positions),
                      q(inputs.q_documents), k(inputs.k_documents))
