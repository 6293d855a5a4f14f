"""Min-p filtering (Nguyen et al. 2024)."""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from specformer.registry.params import Params


class MinP:
    """Drop tokens less likely than ``p`` times the likeliest token's probability.

    The threshold scales with the model's confidence: a peaked distribution keeps few
    tokens, a flat one many. The ``min_tokens_to_keep`` likeliest tokens always stay.
    """

    class Params(Params):
        p: float = Field(ge=0, le=1, description="Fraction of the top probability a token needs, in [0, 1].")
        min_tokens_to_keep: int = Field(default=1, ge=1, description="Never keep fewer tokens than this.")

    def __init__(self, *, p: float, min_tokens_to_keep: int = 1) -> None:
        if not 0 <= p <= 1:
            raise ValueError(f"min_p needs 0 <= p <= 1, got {p}")
        if min_tokens_to_keep < 1:
            raise ValueError(f"min_tokens_to_keep must be >= 1, got {min_tokens_to_keep}")
        self.p = float(p)
        self.min_tokens_to_keep = min_tokens_to_keep

    @classmethod
    def from_params(cls, params: Params) -> "MinP":
        return cls(p=params.p, min_tokens_to_keep=params.min_tokens_to_keep)

    def __call__(self, logits: Tensor, input_ids: Tensor) -> Tensor:
        probs = logits.softmax(dim=-1)
        threshold = self.p * probs.amax(dim=-1, keepdim=True)  # (B, 1)
        drop = probs < threshold
        keep = torch.topk(probs, min(self.min_tokens_to_keep, probs.shape[-1]), dim=-1).indices
        drop.scatter_(-1, keep, False)
        return logits.masked_fill(drop, float("-inf"))

    def __repr__(self) -> str:
        return f"min_p(p={self.p})"
