"""Attention over the keys an indexer chose: each query reads its own ``k`` gathered keys.

The dense kernels read every key and mask most of them; at ``T`` queries and ``k``
chosen keys each, this reads ``T x k`` scores instead of ``T x T``. It runs one block of
queries at a time (the indexer's :meth:`~.indexer.LightningIndexer.selections`), so the
largest tensors are a block's gathered keys ``(B, KV, block, k, hd)`` and its index scores
``(B, block, S)``: memory grows linearly with the context for a fixed block.
"""

from __future__ import annotations

from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor


def gathered_attention(q: Tensor, k: Tensor, v: Tensor, *, chosen: Tensor, readable: Tensor, scale: float,
                       dropout: float = 0.0) -> tuple[Tensor, Tensor]:
    """``softmax(scale * q k_chosen^T, masked) v_chosen`` ``(B, H, Tq, vd)``, and the weights summed over heads ``(B, Tq, n)``.

    ``q`` ``(B, H, Tq, hd)``, ``k`` ``(B, KV, S, hd)``, ``v`` ``(B, KV, S, vd)`` with KV dividing H
    (every query head of a group reads its group's keys); ``chosen`` ``(B, Tq, n)`` key slots per
    query, shared by the heads; ``readable`` ``(B, Tq, n)`` False where a chosen slot is not to be read.
    """
    B, H, Tq, hd = q.shape
    KV, n, vd = k.shape[1], chosen.shape[-1], v.shape[-1]
    G = H // KV
    batch = torch.arange(B, device=q.device)[:, None, None, None]
    head = torch.arange(KV, device=q.device)[None, :, None, None]
    keys = k[batch, head, chosen[:, None]].view(B * KV * Tq, n, hd)  # one row of n keys per (b, kv, query)
    if v.data_ptr() == k.data_ptr() and v.stride() == k.stride():
        values = keys[..., :vd]  # the values are the keys' first channels (MLA's latent): gathered once
    else:
        values = v[batch, head, chosen[:, None]].view(B * KV * Tq, n, vd)
    grouped = q.view(B, KV, G, Tq, hd).transpose(2, 3).reshape(B * KV * Tq, G, hd)  # the group's heads per query
    logits = (grouped @ keys.transpose(1, 2)) * scale  # (B*KV*Tq, G, n)
    if logits.dtype not in (torch.float32, torch.float64):
        logits = logits.float()  # the softmax in at least float32, as the eager kernel
    mask = readable[:, None].expand(B, KV, Tq, n).reshape(B * KV * Tq, 1, n)
    weights = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)
    weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)  # a row with nothing to read: zeros, no NaN
    summed = weights.detach().view(B, KV, Tq, G, n).sum(dim=(1, 3))  # (B, Tq, n): what an indexer learns to predict
    weights = F.dropout(weights.to(v.dtype), p=dropout, training=dropout > 0)
    out = (weights @ values).view(B, KV, Tq, G, vd).transpose(2, 3)  # (B, KV, G, Tq, vd)
    return out.reshape(B, H, Tq, vd), summed


def blockwise(q: Tensor, k: Tensor, v: Tensor, *, selections: Iterator[tuple[slice, Tensor, Tensor]], scale: float,
              dropout: float = 0.0, each: Callable[[slice, Tensor, Tensor, Tensor], None] | None = None) -> Tensor:
    """:func:`gathered_attention` over each block of queries the ``selections`` cover: ``(B, H, Tq, vd)``.

    ``each(rows, chosen, readable, summed_weights)`` is told every block (an indexer's training loss).
    """
    pieces = []
    for rows, chosen, readable in selections:
        out, summed = gathered_attention(q[:, :, rows], k, v, chosen=chosen, readable=readable, scale=scale,
                                         dropout=dropout)
        if each is not None:
            each(rows, chosen, readable, summed)
        pieces.append(out)
    return torch.cat(pieces, dim=2)


def selected_mask(selections: Iterator[tuple[slice, Tensor, Tensor]], *, batch: int, queries: int,
                  keys: int) -> Tensor:
    """The chosen, readable keys of every query as a dense boolean ``(B, 1, Tq, S)`` (for the eager kernel)."""
    mask = None
    for rows, chosen, readable in selections:
        if mask is None:
            mask = torch.zeros(batch, queries, keys, dtype=torch.bool, device=chosen.device)
        mask[:, rows] = mask[:, rows].scatter(-1, chosen, readable)
    return mask[:, None]
