"""Sigmoid top-k routing with a selection-only bias for auxiliary-loss-free balancing (DeepSeek-V3)."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from specformer_layers.routers.base import GroupedTopK, Routing, keep_best_groups
from specformer_layers.routers.params import SigmoidTopKParams


class SigmoidTopK(GroupedTopK):
    """Sigmoid top-k routing with a selection-only balancing bias (:class:`SigmoidTopKParams`)."""

    Params = SigmoidTopKParams

    def __init__(self, params: SigmoidTopKParams | None = None, *, d_model: int, n_experts: int, top_k: int) -> None:
        params = params if params is not None else self.Params()
        super().__init__(params, d_model=d_model, n_experts=n_experts, top_k=top_k)
        self.bias_update_rate = params.bias_update_rate
        self.bias_on = params.bias_on
        self.logit_softcap = params.logit_softcap
        # None without the bias (selection_bias: false): no tensor in the state dict, nothing for training to move.
        self.register_buffer("selection_bias", torch.zeros(n_experts, dtype=torch.float32) if params.selection_bias else None)
        #: Routing slots each expert received in training forwards since the train plugin last read them.
        self.observed_load: Tensor | None = None

    def forward(self, tokens: Tensor) -> Routing:
        logits = self.logits(tokens)  # (N, E)
        if self.logit_softcap is not None:  # bounded before scoring (and before a selection bias on the logits)
            logits = torch.tanh(logits / self.logit_softcap) * self.logit_softcap
        scores = self.score(logits)  # (N, E)
        candidates = scores
        if self.selection_bias is not None:  # the bias picks experts, never weighs them
            biased = logits if self.bias_on == "logit" else scores
            candidates = biased + self.selection_bias.to(biased.dtype)
        if self.n_group > 1:
            candidates = keep_best_groups(candidates, n_group=self.n_group, topk_group=self.topk_group,
                                          group_score="top2_sum")
        experts = candidates.topk(self.top_k, dim=-1).indices  # (N, k)
        weights = scores.gather(1, experts)  # (N, k)
        if self.normalize:
            weights = self.renormalized(weights)
        if self.scaling_factor != 1.0:
            weights = weights * self.scaling_factor
        if self.training and self.bias_update_rate > 0 and self.selection_bias is not None:
            self._observe(experts)
        # The load-balancing loss wants a distribution: the scores normalised per token, as
        # DeepSeek-V3's complementary sequence-wise loss does.
        probs = scores / scores.sum(dim=-1, keepdim=True)
        return Routing(weights, experts, probs)

    def score(self, logits: Tensor) -> Tensor:
        """Each expert's score from the logits ``(N, E)`` (a subclass scores otherwise)."""
        return logits.sigmoid()

    def renormalized(self, weights: Tensor) -> Tensor:
        """The chosen experts' weights ``(N, k)`` rescaled to sum to one (DeepSeek-V3's form, 1e-20 against 0/0)."""
        return weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)

    def _observe(self, experts: Tensor) -> None:
        slots = experts.flatten()
        counts = torch.zeros(self.n_experts, dtype=torch.float32, device=slots.device)
        counts = counts.scatter_add(0, slots, torch.ones_like(slots, dtype=torch.float32))
        # Micro-batches (and the re-run forward of activation checkpointing) add up; only the
        # sign of each expert's distance from the mean is used, so a uniform repeat is harmless.
        self.observed_load = counts if self.observed_load is None else self.observed_load + counts

    def init_weights(self, *, std: float, residual_std: float) -> None:
        super().init_weights(std=std, residual_std=residual_std)
        if self.selection_bias is not None:
            self.selection_bias.zero_()  # balanced until training observes otherwise

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> Any:
        bias = self.selection_bias
        if bias is None:
            return super()._apply(fn, recurse)
        super()._apply(fn, recurse)
        moved = self.selection_bias
        if bias.is_meta or moved.is_meta:  # sizing, or just materialised from meta: only the dtype to restore
            self._buffers["selection_bias"] = moved.to(torch.float32)
        else:  # keep the float32 values a cast to a lower precision would round
            self._buffers["selection_bias"] = bias.to(device=moved.device, dtype=torch.float32)
        return self

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, bias_update_rate={self.bias_update_rate}, "
                f"selection_bias={self.selection_bias is not None}, bias_on={self.bias_on!r}")
