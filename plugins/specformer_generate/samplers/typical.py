"""Locally typical sampling (Meister et al. 2022)."""

from __future__ import annotations

import torch
from torch import Tensor

from specformer_generate.samplers.params import TypicalParams


class Typical:
    """Keep the tokens whose surprisal is closest to the distribution's entropy, up to mass ``p``.

    Its settings and the rule in full: :class:`TypicalParams`.
    """

    Params = TypicalParams

    def __init__(self, params: TypicalParams) -> None:
        self.p = float(params.p)
        self.min_tokens_to_keep = params.min_tokens_to_keep

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
