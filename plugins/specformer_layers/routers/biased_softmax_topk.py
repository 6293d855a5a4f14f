"""Softmax top-k routing with a selection-only balancing bias and a floor under the renormalisation (ERNIE 4.5 MoE)."""

from __future__ import annotations

from torch import Tensor

from specformer_layers.routers.params import BiasedSoftmaxTopKParams
from specformer_layers.routers.sigmoid_topk import SigmoidTopK


class BiasedSoftmaxTopK(SigmoidTopK):
    """``sigmoid_topk`` with the scores a softmax over all experts, renormalised by ``max(sum, norm_min)``
    (:class:`BiasedSoftmaxTopKParams`)."""

    Params = BiasedSoftmaxTopKParams

    def __init__(self, params: BiasedSoftmaxTopKParams | None = None, *, d_model: int, n_experts: int,
                 top_k: int) -> None:
        params = params if params is not None else self.Params()
        super().__init__(params, d_model=d_model, n_experts=n_experts, top_k=top_k)
        self.norm_min = params.norm_min

    def score(self, logits: Tensor) -> Tensor:
        return logits.softmax(dim=-1)

    def renormalized(self, weights: Tensor) -> Tensor:
        return weights / weights.sum(dim=-1, keepdim=True).clamp(min=self.norm_min)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, norm_min={self.norm_min}"
