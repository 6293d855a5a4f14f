"""Llama 4's routing: the top-k logits through a sigmoid, scaling what each chosen expert reads."""

from __future__ import annotations

from torch import Tensor

from specformer_layers.routers.base import LinearRouter, Routing
from specformer_layers.routers.params import TopKSigmoidParams


class TopKSigmoid(LinearRouter):
    """Top-k experts by logit, weighted by the logit's sigmoid, on the expert's input or output (:class:`TopKSigmoidParams`)."""

    Params = TopKSigmoidParams

    def __init__(self, params: TopKSigmoidParams | None = None, *, d_model: int, n_experts: int, top_k: int) -> None:
        params = params if params is not None else TopKSigmoidParams()
        super().__init__(d_model=d_model, n_experts=n_experts, top_k=top_k)
        self.weights_on = params.weights_on

    def forward(self, tokens: Tensor) -> Routing:
        logits = self.logits(tokens)  # (N, E)
        best, experts = logits.topk(self.top_k, dim=-1)  # (N, k) each
        # The load-balancing loss wants a distribution over all experts: the softmax of the logits.
        return Routing(best.sigmoid(), experts, logits.softmax(dim=-1))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, weights_on={self.weights_on}"
