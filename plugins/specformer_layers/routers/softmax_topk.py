"""Softmax top-k routing (Shazeer et al. 2017; Switch, Mixtral, Qwen-MoE, DeepSeek-V2, gpt-oss)."""

from __future__ import annotations

from torch import Tensor

from specformer_layers.routers.base import GroupedTopK, Routing, keep_best_groups
from specformer_layers.routers.params import SoftmaxTopKParams


class SoftmaxTopK(GroupedTopK):
    """Softmax top-k routing (:class:`SoftmaxTopKParams`)."""

    Params = SoftmaxTopKParams

    def forward(self, tokens: Tensor) -> Routing:
        probs = self.logits(tokens).softmax(dim=-1)  # (N, E)
        candidates = probs
        if self.n_group > 1:
            candidates = keep_best_groups(probs, n_group=self.n_group, topk_group=self.topk_group, group_score="max")
        experts = candidates.topk(self.top_k, dim=-1).indices  # (N, k)
        weights = probs.gather(1, experts)  # (N, k)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        if self.scaling_factor != 1.0:
            weights = weights * self.scaling_factor
        return Routing(weights, experts, probs)
