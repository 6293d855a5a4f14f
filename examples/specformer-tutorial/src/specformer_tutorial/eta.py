"""Eta sampling: drop tokens below an entropy-dependent threshold (Hewitt et al. 2022)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from specformer_tutorial.params import EtaSamplingParams


class EtaSampling:
    """Eta sampling, called with the logits ``(B, V)`` and the tokens so far; its settings: :class:`EtaSamplingParams`."""

    Params = EtaSamplingParams

    def __init__(self, params: EtaSamplingParams) -> None:  # samplers receive no sizes: only their params
        self.epsilon = params.epsilon
        self.min_tokens_to_keep = params.min_tokens_to_keep

    def __call__(self, logits: Tensor, input_ids: Tensor) -> Tensor:
        """``(B, V)`` logits in, the same logits with dropped tokens at ``-inf`` out."""
        log_probs = logits.float().log_softmax(dim=-1)  # (B, V)
        probs = log_probs.exp()
        # Entropy in nats; 0 * log 0 counts as 0 for tokens already at -inf.
        entropy = -(probs * log_probs.nan_to_num(neginf=0.0)).sum(dim=-1, keepdim=True)  # (B, 1)
        eta = torch.minimum(torch.full_like(entropy, self.epsilon), math.sqrt(self.epsilon) * torch.exp(-entropy))
        drop = probs < eta
        keep = torch.topk(probs, min(self.min_tokens_to_keep, probs.shape[-1]), dim=-1).indices
        drop.scatter_(-1, keep, False)
        return logits.masked_fill(drop, float("-inf"))

    def __repr__(self) -> str:
        return f"eta(epsilon={self.epsilon})"
