"""Top-k filtering (Fan et al. 2018)."""

from __future__ import annotations

import torch
from torch import Tensor

from specformer_generate.samplers.params import TopKParams


class TopK:
    """Keep the ``k`` likeliest tokens; every other logit becomes ``-inf``.

    Its settings and the rule in full: :class:`TopKParams`.
    """

    Params = TopKParams

    def __init__(self, params: TopKParams) -> None:
        self.k = params.k
        self.min_tokens_to_keep = params.min_tokens_to_keep

    def __call__(self, logits: Tensor, input_ids: Tensor) -> Tensor:
        k = min(max(self.k, self.min_tokens_to_keep), logits.shape[-1])
        kth_largest = torch.topk(logits, k, dim=-1).values[..., -1:]  # (B, 1)
        return logits.masked_fill(logits < kth_largest, float("-inf"))

    def __repr__(self) -> str:
        return f"top_k(k={self.k})"
