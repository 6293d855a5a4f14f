"""Top-k filtering (Fan et al. 2018)."""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from specformer.registry.params import Params


class TopK:
    """Keep the ``k`` likeliest tokens; every other logit becomes ``-inf``.

    A token tied with the k-th largest logit is kept too, so more than ``k`` tokens can
    survive when logits tie (the rule Hugging Face transformers uses).
    """

    class Params(Params):
        k: int = Field(gt=0, description="Number of likeliest tokens kept.")
        min_tokens_to_keep: int = Field(default=1, ge=1, description="Never keep fewer tokens than this.")

    def __init__(self, *, k: int, min_tokens_to_keep: int = 1) -> None:
        if k < 1:
            raise ValueError(f"top_k needs k >= 1, got {k}")
        if min_tokens_to_keep < 1:
            raise ValueError(f"min_tokens_to_keep must be >= 1, got {min_tokens_to_keep}")
        self.k = k
        self.min_tokens_to_keep = min_tokens_to_keep

    @classmethod
    def from_params(cls, params: Params) -> "TopK":
        return cls(k=params.k, min_tokens_to_keep=params.min_tokens_to_keep)

    def __call__(self, logits: Tensor, input_ids: Tensor) -> Tensor:
        k = min(max(self.k, self.min_tokens_to_keep), logits.shape[-1])
        kth_largest = torch.topk(logits, k, dim=-1).values[..., -1:]  # (B, 1)
        return logits.masked_fill(logits < kth_largest, float("-inf"))

    def __repr__(self) -> str:
        return f"top_k(k={self.k})"
