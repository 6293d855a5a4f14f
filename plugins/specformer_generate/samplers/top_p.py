"""Nucleus (top-p) filtering (Holtzman et al. 2019)."""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from specformer.registry.params import Params


class TopP:
    """Keep the smallest set of likeliest tokens whose probabilities add up to at least ``p``.

    Tokens are sorted by probability; walking up from the least likely, a token is
    dropped while the mass of it and everything below it is at most ``1 - p``. The
    ``min_tokens_to_keep`` likeliest tokens always stay.
    """

    class Params(Params):
        p: float = Field(gt=0, le=1, description="Probability mass kept, in (0, 1]; 1 keeps every token.")
        min_tokens_to_keep: int = Field(default=1, ge=1, description="Never keep fewer tokens than this.")

    def __init__(self, *, p: float, min_tokens_to_keep: int = 1) -> None:
        if not 0 < p <= 1:
            raise ValueError(f"top_p needs 0 < p <= 1, got {p}")
        if min_tokens_to_keep < 1:
            raise ValueError(f"min_tokens_to_keep must be >= 1, got {min_tokens_to_keep}")
        self.p = float(p)
        self.min_tokens_to_keep = min_tokens_to_keep

    @classmethod
    def from_params(cls, params: Params) -> "TopP":
        return cls(p=params.p, min_tokens_to_keep=params.min_tokens_to_keep)

    def __call__(self, logits: Tensor, input_ids: Tensor) -> Tensor:
        ascending, order = torch.sort(logits, dim=-1)  # least likely first
        mass_at_or_below = ascending.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = mass_at_or_below <= 1 - self.p
        drop_sorted[..., -self.min_tokens_to_keep :] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
        return logits.masked_fill(drop, float("-inf"))

    def __repr__(self) -> str:
        return f"top_p(p={self.p})"
