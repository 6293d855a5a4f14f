"""Softmax top-k routing (Shazeer et al. 2017; Switch, Mixtral, Qwen-MoE, DeepSeek-V2, gpt-oss)."""

from __future__ import annotations

from pydantic import Field
from torch import Tensor

from specformer.registry.params import FromParams
from specformer_layers.routers.base import LinearRouter, Routing, check_groups, keep_best_groups
from specformer_layers.routers.groups import GroupedParams


class SoftmaxTopK(FromParams, LinearRouter):
    """Softmax over the experts' scores; each token goes to the ``top_k`` most probable.

    Weights are the kept probabilities, rescaled to sum to one with ``normalize`` (Mixtral,
    Qwen3-MoE, and gpt-oss, whose softmax over the top-k logits is the same thing) or left
    as they are (Qwen2-MoE, Switch, DeepSeek-V2), then multiplied by ``scaling_factor``
    (DeepSeek's ``routed_scaling_factor``). ``bias`` adds a learned bias to the scores
    (gpt-oss). With ``n_group`` > 1 a token picks only among the experts of its
    ``topk_group`` groups with the highest best-expert probability (DeepSeek-V2's
    group-limited greedy routing).
    """

    class Params(GroupedParams):
        normalize: bool = Field(default=True, description="Rescale the kept top-k probabilities to sum to 1.")
        bias: bool = Field(default=False, description="A learned bias on each expert's score (gpt-oss).")
        scaling_factor: float = Field(
            default=1.0, gt=0, description="Multiplies the routing weights (DeepSeek's routed_scaling_factor).",
        )

    def __init__(self, *, d_model: int, n_experts: int, top_k: int, normalize: bool = True, bias: bool = False,
                 scaling_factor: float = 1.0, n_group: int = 1, topk_group: int = 1) -> None:
        super().__init__(d_model=d_model, n_experts=n_experts, top_k=top_k, bias=bias)
        check_groups(n_experts=n_experts, top_k=top_k, n_group=n_group, topk_group=topk_group)
        self.normalize = normalize
        self.scaling_factor = scaling_factor
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
