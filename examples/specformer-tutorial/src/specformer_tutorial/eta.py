"""Eta sampling: drop tokens below an entropy-dependent threshold (Hewitt et al. 2022)."""

from __future__ import annotations

import math

import torch
from pydantic import Field
from specformer.registry.params import Params
from torch import Tensor


class EtaSampling:
    """Drop every token whose probability is below ``eta = min(epsilon, sqrt(epsilon) * exp(-entropy))``.

    A confident (low-entropy) distribution gets a threshold close to ``epsilon``; a
    flat one a much lower threshold, so it keeps more of its long tail. The
    ``min_tokens_to_keep`` likeliest tokens always stay. ``epsilon`` between 3e-4
    and 2e-3 is the range the paper recommends.
    """

    class Params(Params):
        epsilon: float = Field(gt=0, lt=1, examples=[0.0009], description="Upper bound of the threshold, in (0, 1).")
        min_tokens_to_keep: int = Field(default=1, ge=1, description="Never keep fewer tokens than this.")

    def __init__(self, *, epsilon: float, min_tokens_to_keep: int = 1) -> None:
        if not 0 < epsilon < 1:
            raise ValueError(f"eta sampling needs 0 < epsilon < 1, got {epsilon}")
        if min_tokens_to_keep < 1:
            raise ValueError(f"min_tokens_to_keep must be >= 1, got {min_tokens_to_keep}")
        self.epsilon = float(epsilon)
        self.min_tokens_to_keep = min_tokens_to_keep

    @classmethod
    def from_params(cls, params: Params) -> "EtaSampling":
        # Samplers receive no sizes: only their params.
        return cls(epsilon=params.epsilon, min_tokens_to_keep=params.min_tokens_to_keep)

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
