"""Locally typical sampling (Meister et al. 2022)."""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from specformer.registry.params import Params


class Typical:
    """Keep the tokens whose surprisal is closest to the distribution's entropy, up to mass ``p``.

    With ``H = -sum p_i log p_i``, tokens are ranked by ``|-log p_i - H|`` (most typical
    first) and kept until their probabilities add up to ``p``; the token that crosses
    ``p`` is kept, and so is every token tied with it. The likeliest token may be dropped.
    """

    class Params(Params):
        p: float = Field(gt=0, lt=1, description="Probability mass of the most typical tokens kept, in (0, 1).")
        min_tokens_to_keep: int = Field(default=1, ge=1, description="Never keep fewer tokens than this.")

    def __init__(self, *, p: float, min_tokens_to_keep: int = 1) -> None:
        if not 0 < p < 1:
            raise ValueError(f"typical needs 0 < p < 1, got {p}")
        if min_tokens_to_keep < 1:
            raise ValueError(f"min_tokens_to_keep must be >= 1, got {min_tokens_to_keep}")
        self.p = float(p)
        self.min_tokens_to_keep = min_tokens_to_keep

    @classmethod
    def from_params(cls, params: Params) -> "Typical":
        return cls(p=params.p, min_tokens_to_keep=params.min_tokens_to_keep)

    def __call__(self, logits: Tensor, input_ids: Tensor) -> Tensor:
        log_probs = logits.log_softmax(dim=-1)
        entropy = -(log_probs * log_probs.exp()).nansum(dim=-1, keepdim=True)  # (B, 1); 0 * -inf is nan
        atypicality = (-log_probs - entropy).abs()
        ranked, order = torch.sort(atypicality, dim=-1)  # most typical first
        mass = logits.gather(-1, order).softmax(dim=-1).cumsum(dim=-1)
        crossing = (mass < self.p).sum(dim=-1, keepdim=True).clamp(max=logits.shape[-1] - 1)  # (B, 1)
        drop_sorted = ranked > ranked.gather(-1, crossing)
        drop_sorted[..., : self.min_tokens_to_keep] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        return logits.masked_fill(drop, float("-inf"))

    def __repr__(self) -> str:
        return f"typical(p={self.p})"
