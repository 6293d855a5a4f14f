"""PhiMoE's SparseMixer top-2 routing at inference (Liu et al. 2024, GRIN: GRadient-INformed MoE)."""

from __future__ import annotations

import torch
from torch import Tensor

from specformer_layers.routers.base import LinearRouter, Routing
from specformer_layers.routers.params import SparseMixerParams


class SparseMixer(LinearRouter):
    """The best expert, then the best of the rest, each weighed by a softmax over its near rivals (:class:`SparseMixerParams`)."""

    Params = SparseMixerParams

    def __init__(self, params: SparseMixerParams | None = None, *, d_model: int, n_experts: int, top_k: int) -> None:
        params = params if params is not None else SparseMixerParams()
        params.sized(d_model=d_model, n_experts=n_experts, top_k=top_k)  # top_k must be 2
        super().__init__(d_model=d_model, n_experts=n_experts, top_k=top_k)
        self.jitter_eps = params.jitter_eps

    def forward(self, tokens: Tensor) -> Routing:
        scores = self.logits(tokens)  # (N, E)
        first_weight, first = self._choose(scores, scores)
        # The second choice: the first expert taken out, the same rule over what is left.
        rest = scores.scatter(-1, first, float("-inf"))  # (N, E)
        second_weight, second = self._choose(scores, rest)
        weights = torch.cat((first_weight, second_weight), dim=-1)  # (N, 2)
        experts = torch.cat((first, second), dim=-1)  # (N, 2)
        return Routing(weights, experts, scores.softmax(dim=-1))

    def _choose(self, scores: Tensor, candidates: Tensor) -> tuple[Tensor, Tensor]:
        """The best of ``candidates`` ``(N, E)`` and its weight, both ``(N, 1)``: the softmax over the candidates whose
        logit is within a relative ``2 * jitter_eps`` of the best one's (distances measured on ``scores``)."""
        with torch.no_grad():  # which experts share the softmax is a choice, not differentiated
            best, chosen = candidates.max(dim=-1, keepdim=True)  # (N, 1) each
            scale = scores.abs().clamp(min=best)  # max(|s_j|, s_best): a relative distance
            far = (best - scores) / scale > 2 * self.jitter_eps  # (N, E)
        probs = candidates.masked_fill(far, float("-inf")).softmax(dim=-1)  # (N, E)
        return probs.gather(-1, chosen), chosen

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, jitter_eps={self.jitter_eps}"
