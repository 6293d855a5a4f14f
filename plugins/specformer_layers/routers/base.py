"""What every router returns, the linear scoring they share, and grouped (node-limited) selection."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specformer_layers.routers.params import GroupedParams, check_top_k


class Routing(NamedTuple):
    """A router's decision for ``N`` tokens.

    ``weights`` ``(N, k)``: how much each chosen expert's output counts (at least float32);
    ``experts`` ``(N, k)``: the chosen experts' indices; ``probs`` ``(N, E)``: a probability
    per expert summing to one per token, the ``P_e`` of the load-balancing loss.
    """

    weights: Tensor
    experts: Tensor
    probs: Tensor


class LinearRouter(nn.Module):
    """Base of the built-in routers: one score per expert, ``tokens @ weight.T (+ bias)``, in float32.

    ``weight`` is ``(n_experts, d_model)``, laid out as ``nn.Linear`` stores it (so a checkpoint's
    ``gate.weight`` copies in unchanged). It is a plain parameter, not an ``nn.Linear``: routing
    decisions stay in float whatever else is quantized. Scores are computed in float32 (float64
    for a float64 model) as DeepSeek does, so a bfloat16 model picks experts as a float32 one would.

    A subclass implements ``forward(tokens (N, D)) -> Routing``. Two class facts tell the
    ``moe`` how to call and apply it: ``weights_on`` (``"output"``: each chosen expert's
    output is multiplied by its weight; ``"input"``: the expert reads the token multiplied by
    it, as Llama 4 does) and ``reads_token_ids`` (True: called as
    ``forward(tokens, token_ids=(N,))`` with the forward's token ids, as hash routing needs).
    """

    weights_on: str = "output"
    reads_token_ids: bool = False

    def __init__(self, *, d_model: int, n_experts: int, top_k: int, bias: bool = False) -> None:
        super().__init__()
        check_top_k(n_experts=n_experts, top_k=top_k)
        self.d_model = d_model
        self.n_experts = n_experts
        self.top_k = top_k
        self.weight = nn.Parameter(torch.empty(n_experts, d_model))
        self.bias = nn.Parameter(torch.zeros(n_experts)) if bias else None
        nn.init.normal_(self.weight, std=0.02)

    def logits(self, tokens: Tensor) -> Tensor:
        """One score per expert ``(N, E)``, at least float32."""
        dtype = torch.promote_types(tokens.dtype, torch.float32)
        bias = self.bias.to(dtype) if self.bias is not None else None
        return F.linear(tokens.to(dtype), self.weight.to(dtype), bias)

    def init_weights(self, *, std: float, residual_std: float) -> None:
        nn.init.normal_(self.weight, std=std)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, n_experts={self.n_experts}, top_k={self.top_k}, bias={self.bias is not None}"


class GroupedTopK(LinearRouter):
    """Base of the routers whose settings are :class:`GroupedParams` (``softmax_topk``, ``sigmoid_topk``).

    Reads the settings they share: ``normalize``, ``scaling_factor`` and the grouping
    (``n_group``, ``topk_group``, checked against the experts here), and the score bias.
    A subclass names its ``Params`` and implements ``forward``.
    """

    Params: type[GroupedParams] = GroupedParams

    def __init__(self, params: GroupedParams | None = None, *, d_model: int, n_experts: int, top_k: int) -> None:
        params = params if params is not None else self.Params()
        super().__init__(d_model=d_model, n_experts=n_experts, top_k=top_k, bias=params.bias)
        params.sized(d_model=d_model, n_experts=n_experts, top_k=top_k)  # the grouping fits the experts
        self.normalize = params.normalize
        self.scaling_factor = params.scaling_factor
        self.n_group = params.n_group
        self.topk_group = params.topk_group

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, normalize={self.normalize}, scaling_factor={self.scaling_factor}, "
                f"n_group={self.n_group}, topk_group={self.topk_group}")


def keep_best_groups(scores: Tensor, *, n_group: int, topk_group: int, group_score: str) -> Tensor:
    """``scores`` ``(N, E)`` with every expert outside each token's ``topk_group`` best groups set to -inf.

    Experts are split into ``n_group`` contiguous groups (DeepSeek's devices or nodes); a
    group's score is its best expert's (``max``, DeepSeek-V2) or the sum of its two best
    (``top2_sum``, DeepSeek-V3). Top-k selection then only sees the kept groups, which
    bounds how many devices a token's experts live on.
    """
    n_tokens, n_experts = scores.shape
    grouped = scores.view(n_tokens, n_group, n_experts // n_group)  # (N, G, E/G)
    if group_score == "max":
        per_group = grouped.amax(dim=-1)  # (N, G)
    else:
        per_group = grouped.topk(2, dim=-1).values.sum(dim=-1)  # (N, G)
    best = per_group.topk(topk_group, dim=-1).indices  # (N, topk_group)
    kept = torch.zeros_like(per_group, dtype=torch.bool).scatter(1, best, True)  # (N, G)
    kept = kept[..., None].expand_as(grouped).reshape(n_tokens, n_experts)  # (N, E)
    return scores.masked_fill(~kept, float("-inf"))
