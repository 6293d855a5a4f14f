"""Softmax top-k routing (Shazeer et al. 2017; Switch, Mixtral, Qwen-MoE, DeepSeek-V2, gpt-oss)."""

from __future__ import annotations

from torch import Tensor

from specformer_layers.routers.base import LinearRouter, Routing, keep_best_groups
from specformer_layers.routers.params import SoftmaxTopKParams


class SoftmaxTopK(LinearRouter):
    """Softmax top-k routing (:class:`SoftmaxTopKParams`)."""

    Params = SoftmaxTopKParams

    def __init__(self, params: SoftmaxTopKParams | None = None, *, d_model: int, n_experts: int, top_k: int) -> None:
        params = params if params is not None else SoftmaxTopKParams()
        super().__init__(d_model=d_model, n_experts=n_experts, top_k=top_k, bias=params.bias)
        n_group, topk_group = params.n_group, params.topk_group
        params.sized(d_model=d_model, n_experts=n_experts, top_k=top_k)  # the grouping fits the experts
        self.normalize = params.normalize
        self.scaling_factor = params.scaling_factor
        self.n_group = n_group
        self.topk_group = topk_group

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

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, normalize={self.normalize}, scaling_factor={self.scaling_factor}, "
                f"n_group={self.n_group}, topk_group={self.topk_group}")
