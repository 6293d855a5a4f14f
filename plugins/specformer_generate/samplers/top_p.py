"""Nucleus (top-p) filtering (Holtzman et al. 2019)."""

from __future__ import annotations

import torch
from torch import Tensor

from specformer_generate.samplers.params import TopPParams


class TopP:
    """Keep the smallest set of likeliest tokens whose probabilities add up to at least ``p``.

    Its settings and the rule in full: :class:`TopPParams`.
    """

    Params = TopPParams

    def __init__(self, params: TopPParams) -> None:
        self.p = float(params.p)
        self.min_tokens_to_keep = params.min_tokens_to_keep

    def __call__(self, logits: Tensor, input_ids: Tensor) -> Tensor:
        ascending, order = torch.sort(logits, dim=-1)  # least likely first
        mass_at_or_below = ascending.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = mass_at_or_below <= 1 - self.p
        drop_sorted[..., -self.min_tokens_to_keep :] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
        return logits.masked_fill(drop, float("-inf"))

    def __repr__(self) -> str:
        return f"top_p(p={self.p})"
