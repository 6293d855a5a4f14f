"""Sequences as a recurrent mixer sees them: packed documents apart, padding kept out of the state.

A recurrence carries everything before a token into it, so two rules that attention gets
from its mask must be kept by construction here:

- in packed training (``document_ids``), a document's tokens must not see the one before it:
  :func:`by_document` cuts the rows into documents, runs the mixer on them as a batch of their
  own (right-padded, which a causal mixer never reads back) and puts the outputs back;
- in a cached forward, the padding that opens a ragged row (negative positions) must leave the
  state as it was: :func:`leading_padding` counts it per row.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor


def leading_padding(positions: Tensor) -> Tensor:
    """``(B,)`` how many tokens open each row with a negative position (padding comes first in a row)."""
    return (positions < 0).sum(dim=1)


def by_document(x: Tensor, document_ids: Tensor, run: Callable[[Tensor], Tensor]) -> Tensor:
    """``run`` applied to every document of the packed rows ``x`` ``(B, T, D)`` on its own; ``(B, T, D_out)``.

    A document is a run of equal ``document_ids`` ``(B, T)`` in a row. ``run`` receives
    ``(N, L, D)``, one document per row, right-padded with zeros to the longest (``L``),
    and returns ``(N, L, D_out)``; a causal mixer's outputs for a document's tokens never
    depend on the padding after them.
    """
    batch, length = document_ids.shape
    starts = torch.ones_like(document_ids, dtype=torch.bool)
    starts[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]  # (B, T): a document begins here
    flat_starts = starts.reshape(-1)
    document = torch.cumsum(flat_starts.long(), 0) - 1  # (B*T,) which document each token is in
    n_documents = int(document[-1]) + 1
    first = torch.nonzero(flat_starts).squeeze(1)  # (N,) flat index of each document's first token
    offset = torch.arange(batch * length, device=x.device) - first[document]  # (B*T,) place within its document
    longest = int(offset.max()) + 1
    packed = x.new_zeros((n_documents, longest, x.shape[-1]))  # (N, L, D)
    packed[document, offset] = x.reshape(batch * length, -1)
    out = run(packed)  # (N, L, D_out)
    return out[document, offset].reshape(batch, length, out.shape[-1])


__all__ = ["by_document", "leading_padding"]
