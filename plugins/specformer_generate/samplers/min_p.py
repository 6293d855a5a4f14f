"""Min-p filtering (Nguyen et al. 2024)."""

from __future__ import annotations

import torch
from torch import Tensor

from specformer_generate.samplers.params import MinPParams


class MinP:
    """Drop tokens less likely than ``p`` times the likeliest token's probability.

    Its settings and the rule in full: :class:`MinPParams`.
    """

    Params = MinPParams

    def __init__(self, params: MinPParams) -> None:
        self.p = float(params.p)
        self.min_tokens_to_keep = params.min_tokens_to_keep

    def __call__(self, logits: Tensor, input_ids: Tensor) -> Tensor:
        probs = logits.softmax(dim=-1)
        threshold = self.p * probs.amax(dim=-1, keepdim=True)  # (B, 1)
        drop = probs < threshold
        keep = torch.topk(probs, min(self.min_tokens_to_keep, probs.shape[-1]), dim=-1).indices
        drop.scatter_(-1, keep, False)
        return logits.masked_fill(drop, float("-inf"))

    def __repr__(self) -> str:
        return f"min_p(p={self.p})"
