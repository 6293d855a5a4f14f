"""Hash routing (Roller et al. 2021; DeepSeek-V4's first layers): each token id's experts fixed by a table."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from specformer_layers.routers.base import LinearRouter, Routing
from specformer_layers.routers.params import HashParams

#: Knuth's multiplicative hash constant (2^32 / golden ratio): consecutive ids spread over the experts.
_KNUTH = 2654435761


class HashRouter(LinearRouter):
    """Experts looked up by token id in ``token_experts``; a learned score weighs them (:class:`HashParams`)."""

    Params = HashParams
    reads_token_ids = True

    def __init__(self, params: HashParams | None = None, *, d_model: int, n_experts: int, top_k: int,
                 vocab_size: int | None = None) -> None:
        params = params if params is not None else HashParams()
        super().__init__(d_model=d_model, n_experts=n_experts, top_k=top_k)
        rows = params.table_rows(vocab_size)
        self.scoring = params.scoring
        self.normalize = params.normalize
        self.scaling_factor = params.scaling_factor
        # A table, not a parameter: never trained, saved with the weights (DeepSeek-V4's tid2eid).
        self.register_buffer("token_experts", fixed_hash(rows, n_experts=n_experts, top_k=top_k))

    def forward(self, tokens: Tensor, token_ids: Tensor | None = None) -> Routing:
        if token_ids is None:
            raise ValueError("hash routing needs the token ids of the forward (run the moe inside a Decoder)")
        scores = self.score(self.logits(tokens))  # (N, E)
        experts = self.token_experts[token_ids.reshape(-1)]  # (N, k)
        weights = scores.gather(1, experts)  # (N, k)
        if self.normalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        if self.scaling_factor != 1.0:
            weights = weights * self.scaling_factor
        probs = scores if self.scoring == "softmax" else scores / scores.sum(dim=-1, keepdim=True)
        return Routing(weights, experts, probs)

    def score(self, logits: Tensor) -> Tensor:
        if self.scoring == "sqrtsoftplus":
            return F.softplus(logits).sqrt()
        if self.scoring == "sigmoid":
            return logits.sigmoid()
        return logits.softmax(dim=-1)

    def init_weights(self, *, std: float, residual_std: float) -> None:
        super().init_weights(std=std, residual_std=residual_std)
        vocab_size = self.token_experts.shape[0]
        self.token_experts.copy_(fixed_hash(vocab_size, n_experts=self.n_experts, top_k=self.top_k))

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, vocab_size={self.token_experts.shape[0]}, scoring={self.scoring}, "
                f"normalize={self.normalize}, scaling_factor={self.scaling_factor}")


def fixed_hash(vocab_size: int, *, n_experts: int, top_k: int) -> Tensor:
    """``(vocab_size, top_k)``: token ``t``'s experts ``(h(t) + j) mod n_experts``, ``h(t) = (t * 2654435761 mod 2^32) mod n_experts``."""
    ids = torch.arange(vocab_size, dtype=torch.int64)
    first = (ids * _KNUTH) % (1 << 32) % n_experts  # (V,)
    return (first[:, None] + torch.arange(top_k, dtype=torch.int64)) % n_experts  # (V, k), distinct per row
