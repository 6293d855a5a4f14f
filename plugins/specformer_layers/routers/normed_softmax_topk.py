"""Softmax top-k routing of the normalised, scaled token, with a scale per expert (Gemma 4)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specformer_layers.routers.base import LinearRouter, Routing
from specformer_layers.routers.params import NormedSoftmaxTopKParams


class NormedSoftmaxTopK(LinearRouter):
    """Softmax top-k of ``rms(x) * scale / sqrt(d)`` scores, weights times a per-expert scale (:class:`NormedSoftmaxTopKParams`)."""

    Params = NormedSoftmaxTopKParams

    def __init__(self, params: NormedSoftmaxTopKParams | None = None, *, d_model: int, n_experts: int, top_k: int) -> None:
        params = params if params is not None else NormedSoftmaxTopKParams()
        super().__init__(d_model=d_model, n_experts=n_experts, top_k=top_k)
        self.eps = params.eps
        self.scale = nn.Parameter(torch.ones(d_model))
        self.expert_scale = nn.Parameter(torch.ones(n_experts))

    def forward(self, tokens: Tensor) -> Routing:
        # Gemma 4 normalises in float32 and scales in the model's dtype, as its RMSNorm without a weight does.
        wide = tokens if tokens.dtype in (torch.float32, torch.float64) else tokens.float()
        normed = F.rms_norm(wide, (self.d_model,), None, self.eps).to(tokens.dtype)
        probs = self.logits(normed * self.scale * self.d_model**-0.5).softmax(dim=-1)  # (N, E)
        weights, experts = probs.topk(self.top_k, dim=-1)  # (N, k) each
        weights = weights / weights.sum(dim=-1, keepdim=True) * self.expert_scale[experts]
        return Routing(weights, experts, probs)

    def init_weights(self, *, std: float, residual_std: float) -> None:
        super().init_weights(std=std, residual_std=residual_std)
        nn.init.ones_(self.scale)
        nn.init.ones_(self.expert_scale)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, eps={self.eps}"
