"""Sigmoid top-k routing with a selection-only bias for auxiliary-loss-free balancing (DeepSeek-V3)."""

from __future__ import annotations

from typing import Any, Callable

import torch
from pydantic import Field
from torch import Tensor

from specformer.registry.params import FromParams
from specformer_layers.routers.base import LinearRouter, Routing, check_groups, keep_best_groups
from specformer_layers.routers.groups import GroupedParams


class SigmoidTopK(FromParams, LinearRouter):
    """Independent sigmoid scores; the ``top_k`` experts are chosen by score plus a balancing bias.

    The bias (``selection_bias``, one value per expert, DeepSeek-V3's
    ``e_score_correction_bias``) only steers which experts are chosen; the weights are the
    chosen experts' plain sigmoid scores, rescaled to sum to one with ``normalize`` and
    multiplied by ``scaling_factor`` (DeepSeek-V3: 2.5). While training, the router counts
    how many tokens each expert received; after every optimizer step the train plugin moves
    each expert's bias by ``bias_update_rate`` towards balance (up for an under-loaded
    expert, down for an over-loaded one), so no auxiliary loss is needed (Wang et al.
    2024). With ``n_group`` > 1 a token picks only among the experts of its ``topk_group``
    groups whose two best biased scores sum highest (DeepSeek-V3's node-limited routing).

    The bias is a buffer saved with the weights and kept in float32 when the model is cast:
    steps of 0.001 would vanish in bfloat16.
    """

    class Params(GroupedParams):
        normalize: bool = Field(default=True, description="Rescale the chosen experts' scores to sum to 1 (norm_topk_prob).")
        bias: bool = Field(default=False, description="A learned bias on each expert's score (in the weights, unlike selection_bias).")
        scaling_factor: float = Field(
            default=1.0, gt=0, description="Multiplies the routing weights (DeepSeek's routed_scaling_factor).",
        )
        bias_update_rate: float = Field(
            default=0.001, ge=0,
            description="How far training moves each expert's selection bias per step towards balanced load "
                        "(DeepSeek-V3's gamma); 0 keeps the bias fixed.",
        )

    def __init__(self, *, d_model: int, n_experts: int, top_k: int, normalize: bool = True, bias: bool = False,
                 scaling_factor: float = 1.0, n_group: int = 1, topk_group: int = 1,
                 bias_update_rate: float = 0.001) -> None:
        super().__init__(d_model=d_model, n_experts=n_experts, top_k=top_k, bias=bias)
        # A group's score sums its two best experts, so each group needs two.
        check_groups(n_experts=n_experts, top_k=top_k, n_group=n_group, topk_group=topk_group, min_per_group=2)
        self.normalize = normalize
        self.scaling_factor = scaling_factor
        self.n_group = n_group
        self.topk_group = topk_group
        self.bias_update_rate = bias_update_rate
        self.register_buffer("selection_bias", torch.zeros(n_experts, dtype=torch.float32))
        #: Routing slots each expert received in training forwards since the train plugin last read them.
        self.observed_load: Tensor | None = None

    def forward(self, tokens: Tensor) -> Routing:
        scores = self.logits(tokens).sigmoid()  # (N, E)
        candidates = scores + self.selection_bias.to(scores.dtype)  # the bias picks experts, never weighs them
        if self.n_group > 1:
            candidates = keep_best_groups(candidates, n_group=self.n_group, topk_group=self.topk_group,
                                          group_score="top2_sum")
        experts = candidates.topk(self.top_k, dim=-1).indices  # (N, k)
        weights = scores.gather(1, experts)  # (N, k)
        if self.normalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        if self.scaling_factor != 1.0:
            weights = weights * self.scaling_factor
        if self.training and self.bias_update_rate > 0:
            self._observe(experts)
        # The load-balancing loss wants a distribution: the scores normalised per token, as
        # DeepSeek-V3's complementary sequence-wise loss does.
        probs = scores / scores.sum(dim=-1, keepdim=True)
        return Routing(weights, experts, probs)

    def _observe(self, experts: Tensor) -> None:
        slots = experts.flatten()
        counts = torch.zeros(self.n_experts, dtype=torch.float32, device=slots.device)
        counts = counts.scatter_add(0, slots, torch.ones_like(slots, dtype=torch.float32))
        # Micro-batches (and the re-run forward of activation checkpointing) add up; only the
        # sign of each expert's distance from the mean is used, so a uniform repeat is harmless.
        self.observed_load = counts if self.observed_load is None else self.observed_load + counts

    def init_weights(self, *, std: float, residual_std: float) -> None:
        super().init_weights(std=std, residual_std=residual_std)
        self.selection_bias.zero_()  # balanced until training observes otherwise

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> Any:
        bias = self.selection_bias
        super()._apply(fn, recurse)
        moved = self.selection_bias
        if bias.is_meta or moved.is_meta:  # sizing, or just materialised from meta: only the dtype to restore
            self._buffers["selection_bias"] = moved.to(torch.float32)
        else:  # keep the float32 values a cast to a lower precision would round
            self._buffers["selection_bias"] = bias.to(device=moved.device, dtype=torch.float32)
        return self

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, normalize={self.normalize}, scaling_factor={self.scaling_factor}, "
                f"n_group={self.n_group}, topk_group={self.topk_group}, bias_update_rate={self.bias_update_rate}")
