"""Mixture of attention heads: routed query and output projections over shared keys and values (MoA, JetMoE)."""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specformer.model.context import ForwardContext
from specformer.model.masks import MaskRule
from specformer.model.parallel_plan import ParallelPlan

from specformer_layers.attention.kernels import BACKENDS, Scores, attend, describe
from specformer_layers.attention.mixture_of_heads_params import MixtureOfHeadsParams
from specformer_layers.ffn.moe import _combine, _per_expert, load_balancing_loss
from specformer_layers.routers.softmax_topk import SoftmaxTopK


class MixtureOfHeads(nn.Module):
    """Mixture of attention heads (:class:`MixtureOfHeadsParams`).

    Query head ``i * top_k + j`` is head ``i`` of the expert in routing slot ``j``: the heads
    that read key/value head ``i`` are consecutive, the grouping the attention kernels use for
    grouped-query attention.
    """

    Params = MixtureOfHeadsParams

    def __init__(self, params: MixtureOfHeadsParams, *, d_model: int, layer_index: int = 0) -> None:
        super().__init__()
        params.sized(d_model=d_model)  # top_k fits the experts, head_dim fits d_model
        if params.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {params.backend!r}")
        KV, hd = params.n_kv_heads, params.dim(d_model)
        # The public facts (specformer.model.attention.AttentionLayer): top_k * n_kv_heads query heads per token.
        self.n_experts = params.n_experts
        self.top_k = params.top_k
        self.n_heads = params.top_k * KV
        self.n_kv_heads = KV
        self.head_dim = hd
        self.window = None
        self.layer_index = layer_index
        self.d_model = d_model
        self.scale = params.scale if params.scale is not None else 1.0 / math.sqrt(hd)
        self.dropout = params.dropout
        self.backend = params.backend
        self.mask_rule = MaskRule(window=None, chunk=None)
        self.aux_loss_coef = params.aux_loss_coef
        if params.router is not None:
            self.router = params.router.make(d_model=d_model, n_experts=params.n_experts, top_k=params.top_k)
        else:
            self.router = SoftmaxTopK(params.router_params(), d_model=d_model, n_experts=params.n_experts,
                                      top_k=params.top_k)
        if getattr(self.router, "reads_token_ids", False) or getattr(self.router, "weights_on", "output") != "output":
            raise ValueError("moa: the router must score the token and weight each expert's output (softmax_topk, "
                             "sigmoid_topk, ...); routers reading token ids (hash) or weighting the input are not accepted")
        self.kv = nn.Linear(d_model, 2 * KV * hd, bias=False)  # rows [k; v]
        # Expert e's projections as nn.Linear stores them: queries (KV*hd, d_model), output (d_model, KV*hd).
        self.experts_q = nn.Parameter(torch.empty(params.n_experts, KV * hd, d_model))
        self.experts_out = nn.Parameter(torch.empty(params.n_experts, d_model, KV * hd))
        self.out_bias = nn.Parameter(torch.zeros(d_model)) if params.out_bias else None
        self.aux_loss: Tensor | None = None
        # As the attention mixer's: an inspector receives the probabilities (B, H, T, S) of each forward.
        self.observe_weights: Callable[[Tensor], None] | None = None
        nn.init.normal_(self.experts_q, std=0.02)
        nn.init.normal_(self.experts_out, std=0.02)

    def parallel_plan(self) -> ParallelPlan:
        """None: the experts' 3-D projections would split on their inner dims (see take_tensor_parallel_share)."""
        return {}

    def take_tensor_parallel_share(self, mesh: Any) -> None:
        raise ValueError("tensor parallelism does not split the mixture of attention heads (moa) yet: its experts' "
                         "query and output projections would split by head inside each expert")

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        B, T, D = x.shape
        k, KV, hd = self.top_k, self.n_kv_heads, self.head_dim
        tokens = x.reshape(-1, D)  # (N, D)
        weights, experts, probs = self.router(tokens)  # (N, k), (N, k), (N, E)
        self.aux_loss = (self.aux_loss_coef * load_balancing_loss(probs, experts, self.n_experts)
                         if self.aux_loss_coef else None)
        slots = experts.flatten()  # (N*k,): the expert of each (token, slot)
        order = slots.argsort(stable=True)  # slots grouped by expert
        counts = torch.zeros(self.n_experts, dtype=torch.long, device=slots.device)
        sizes = counts.scatter_add(0, slots, torch.ones_like(slots)).tolist()
        token_of = order // k  # (N*k,): the token of each slot, sorted by expert
        # Queries: each slot's token through its expert's query projection, put back in slot order.
        sorted_q = self._per_expert(tokens.index_select(0, token_of), self.experts_q, sizes)  # (N*k, KV*hd)
        q = torch.empty_like(sorted_q).index_copy_(0, order, sorted_q)  # (N*k, KV*hd), slot order
        q = q.view(B, T, k, KV, hd).permute(0, 3, 2, 1, 4).reshape(B, KV * k, T, hd)  # (B, H, T, hd), head i*k+j
        key, value = self.kv(x).chunk(2, dim=-1)
        key = key.view(B, T, KV, hd).transpose(1, 2)  # (B, KV, T, hd)
        value = value.view(B, T, KV, hd).transpose(1, 2)  # (B, KV, T, hd)
        positional, state = ctx.positional_for(self.layer_index), ctx.positional_state_for(self.layer_index)
        q, key = positional.rotate(q, state), positional.rotate(key, state)
        if ctx.cache is not None:
            key, value, k_positions = ctx.cache.update(self.layer_index, key, value, ctx.positions)  # (B, KV, S, hd)
        else:
            k_positions = ctx.positions
        scores = Scores(scale=self.scale, softcap=None, sinks=None, positional=positional, state=state)
        y = attend(self.backend, ctx=ctx, q=q, k=key, v=value, k_positions=k_positions, rule=self.mask_rule,
                   scores=scores, dropout=self.dropout if self.training else 0.0, observe=self.observe_weights)
        y = y.view(B, KV, k, T, hd).permute(0, 3, 2, 1, 4).reshape(B * T * k, KV * hd)  # (N*k, KV*hd), slot order
        # Outputs: each slot through its expert's output projection, weighted, summed per token.
        sorted_out = self._per_expert(y.index_select(0, order), self.experts_out, sizes)  # (N*k, D)
        sorted_out = sorted_out * weights.to(x.dtype).flatten().index_select(0, order)[:, None]
        out = _combine(sorted_out, token_of=token_of, order=order, n_tokens=B * T)  # (N, D)
        if self.out_bias is not None:
            out = out + self.out_bias
        return out.view(B, T, D)

    @staticmethod
    def _per_expert(grouped: Tensor, stack: Tensor, sizes: list[int]) -> Tensor:
        """Block ``e`` of ``grouped`` (``sizes[e]`` rows, sorted by expert) times expert ``e``'s weight in ``stack``."""
        weight = _per_expert(stack)
        return torch.cat([F.linear(block, weight[e]) for e, block in enumerate(grouped.split(sizes))])

    def active_parameters(self) -> int:
        """Weights one token's forward multiplies by: the router, the keys and values, ``top_k`` experts, the bias."""
        per_expert = (self.experts_q.numel() + self.experts_out.numel()) // self.n_experts
        shared = sum(p.numel() for p in (*self.router.parameters(), *self.kv.parameters()))
        return shared + self.top_k * per_expert + (self.out_bias.numel() if self.out_bias is not None else 0)

    def describe_kernel(self, *, bias: bool = False) -> str:
        """The kernel this layer runs, in words (``specformer summary``)."""
        return describe(backend=self.backend, rule=self.mask_rule, logit_softcap=None, sinks=False, bias=bias)

    def init_weights(self, *, std: float, residual_std: float) -> None:
        # The router initialises itself (Decoder.init_weights reaches every module).
        nn.init.normal_(self.kv.weight, std=std)
        nn.init.normal_(self.experts_q, std=std)
        nn.init.normal_(self.experts_out, std=residual_std)  # feeds the residual stream
        if self.out_bias is not None:
            nn.init.zeros_(self.out_bias)

    def extra_repr(self) -> str:
        return (f"n_experts={self.n_experts}, top_k={self.top_k}, n_kv_heads={self.n_kv_heads}, "
                f"head_dim={self.head_dim}, backend={self.backend}, out_bias={self.out_bias is not None}")
