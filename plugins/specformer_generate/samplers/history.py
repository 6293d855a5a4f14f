"""What the history-aware samplers read: how often each token id occurs in a row.

Rows of ``input_ids`` may hold negative ids: left padding of a batch of prompts of
different lengths (and, in generation, slots not yet written). They are not tokens and
are never counted, so a padded row is penalised exactly as the same row alone.
"""

from __future__ import annotations

import torch
from torch import Tensor


def spare_column_ids(input_ids: Tensor, vocab_size: int) -> Tensor:
    """``input_ids`` with every id outside ``[0, vocab_size)`` moved to the spare column ``vocab_size``.

    Scattering into ``vocab_size + 1`` columns and dropping the last lets padding and ids
    the head cannot produce (a padded embedding table) fall somewhere harmless.
    """
    outside = (input_ids < 0) | (input_ids >= vocab_size)
    return input_ids.masked_fill(outside, vocab_size)


def token_counts(input_ids: Tensor, vocab_size: int, *, dtype: torch.dtype = torch.float32) -> Tensor:
    """``(B, vocab_size)``: how many times each id occurs in each row of ``input_ids`` ``(B, T)``."""
    ids = spare_column_ids(input_ids, vocab_size)
    counts = torch.zeros(ids.shape[0], vocab_size + 1, dtype=dtype, device=ids.device)
    counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=dtype))
    return counts[:, :vocab_size]


def token_seen(input_ids: Tensor, vocab_size: int) -> Tensor:
    """``(B, vocab_size)`` bool: True where the id occurs at least once in the row."""
    ids = spare_column_ids(input_ids, vocab_size)
    seen = torch.zeros(ids.shape[0], vocab_size + 1, dtype=torch.bool, device=ids.device)
    seen.scatter_(1, ids, True)
    return seen[:, :vocab_size]
