"""Multi-head latent attention, MLA (DeepSeek-V2, DeepSeek-V3)."""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import torch
from torch import Tensor, nn

from specformer.model.attention import CacheSlots
from specformer.model.context import ForwardContext
from specformer.model.masks import MaskRule
from specformer.model.parallel_plan import ParallelPlan, Split, local_share
from specformer_layers.attention.params import LatentAttentionParams

from specformer_layers.attention.kernels import Scores, attend, eager
from specformer_layers.attention.sparse import blockwise, selected_mask


class LatentAttention(nn.Module):
    """Multi-head latent attention: keys and values rebuilt from a small cached latent (:class:`LatentAttentionParams`)."""

    #: For caches that only know plain keys and values (they refuse a layer whose kind is not "kv").
    cache_kind = "latent"

    Params = LatentAttentionParams

    def __init__(self, params: LatentAttentionParams, *, d_model: int, layer_index: int = 0) -> None:
        super().__init__()
        n_heads, kv_lora_rank, q_lora_rank = params.n_heads, params.kv_lora_rank, params.q_lora_rank
        qk_rope_head_dim, qk_nope_head_dim, v_head_dim = params.qk_rope_head_dim, params.qk_nope_head_dim, params.v_head_dim
        bias, window = params.bias, params.window
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        self.qk_nope_head_dim = qk_nope_head_dim
        self.qk_rope_head_dim = qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.kv_lora_rank = kv_lora_rank
        self.q_lora_rank = q_lora_rank
        # The public facts (specformer.model.attention.AttentionLayer): every head has its own key and
        # value once expanded; the positional scheme turns only the rotary channels; the cache
        # keeps the shared rotary key as "key" and the latent as "value".
        self.n_heads = n_heads
        self.n_kv_heads = n_heads
        self.head_dim = self.qk_head_dim
        self.positional_dim = qk_rope_head_dim
        self.window = window
        self.layer_index = layer_index
        self.dropout = params.dropout
        self.backend = params.backend
        scale = params.scale if params.scale is not None else 1.0 / math.sqrt(self.qk_head_dim)
        self.scale = scale * yarn_mscale(params.yarn_factor, params.yarn_mscale_all_dim) ** 2

        if q_lora_rank is None:
            self.q_proj = nn.Linear(d_model, n_heads * self.qk_head_dim, bias=False)
        else:
            self.q_a = nn.Linear(d_model, q_lora_rank, bias=bias)
            self.q_norm = params.latent_norm.make(dim=q_lora_rank)
            # Reads [norm(c); c] with q_up_input normed_and_raw (A.X-K2), else norm(c).
            self.q_b = nn.Linear(params.q_up_width, n_heads * self.qk_head_dim, bias=False)
        self.q_up_raw = params.q_up_input == "normed_and_raw"
        # Rows: [latent (kv_lora_rank); rotary key (qk_rope_head_dim)].
        self.kv_a = nn.Linear(d_model, kv_lora_rank + qk_rope_head_dim, bias=bias)
        self.kv_norm = params.latent_norm.make(dim=kv_lora_rank)
        # Rows per head: [k_nope (qk_nope_head_dim); value (v_head_dim)].
        self.kv_b = nn.Linear(kv_lora_rank, n_heads * (qk_nope_head_dim + v_head_dim), bias=False)
        self.out = nn.Linear(n_heads * v_head_dim, d_model, bias=bias)
        # Output gate: one logit per head (Ling 3) or per value channel (A.X-K2), from the block input or from what
        # the query up-projection reads (A.X-K2).
        self.gate = nn.Linear(*params.gate_width(d_model), bias=False) if params.output_gate else None
        self.gate_per_channel = params.output_gate_scope == "channel"
        self.gate_from_query = params.output_gate_input == "query_latent"
        # DeepSeek Sparse Attention: an indexer (any `indexer` component) picks the keys each query
        # reads; it keeps one key per token, stored in the cache's key slot after the rotary key.
        self.indexer = None
        if params.indexer is not None:
            # It reads the query latent (DeepSeek-V3.2), or the block input when queries have no bottleneck.
            self.indexer = params.indexer.make(d_model=d_model, query_dim=q_lora_rank or d_model,
                                               positional_dim=qk_rope_head_dim)
        index_dim = self.indexer.key_dim if self.indexer is not None else 0
        if self.indexer is not None:  # for specformer summary (specformer.model.attention.AttentionLayer)
            self.keys_read = self.indexer.topk
            self.selection_flops_per_key = 2 * self.indexer.n_heads * self.indexer.key_dim
        self.cache_slots = CacheSlots(key_heads=1, key_dim=qk_rope_head_dim + index_dim, value_heads=1,
                                      value_dim=kv_lora_rank)
        # An inspector (specformer_eval.capture) sets this to receive the attention probabilities
        # (B, H, T, S) of each forward; while it is set the written-out softmax is used.
        self.observe_weights: Callable[[Tensor], None] | None = None
        # Under tensor parallelism: what sums the gradient of a key every process reads with its own heads only,
        # and what sums the attention weights of this process' heads over the others' (the indexer's target).
        self.summed_over_heads: Callable[[Tensor], Tensor] = _unchanged
        self.attention_of_all_heads: Callable[[Tensor], Tensor] = _unchanged

    def parallel_plan(self) -> ParallelPlan:
        """Heads over tp (the up-projections from the latents and the output); the latents' down-projections replicated."""
        heads = (Split("tp", 0, self.n_heads, "heads"),)
        return {"q_proj.weight": heads, "q_b.weight": heads, "kv_b.weight": heads, "gate.weight": heads,
                "out.weight": (Split("tp", 1, self.n_heads, "heads"),)}

    def take_tensor_parallel_share(self, mesh: Any) -> None:
        """Compute on ``n_heads / tp`` heads (:mod:`specformer.model.tensor_parallel`); the shared rotary key (and,
        in the sparse form, the latent) is read by every process' heads, so its gradient is summed over ``mesh``,
        and the indexer's target sums every process' heads' attention."""
        # late: only a tensor-parallel run needs DTensors
        from specformer.model.tensor_parallel import gradient_summed, summed_over

        self.n_heads //= mesh.size()
        self.n_kv_heads = self.n_heads
        self.summed_over_heads = functools.partial(gradient_summed, mesh=mesh)
        # the indexer learns from the attention of every head, of which this process computes its own
        self.attention_of_all_heads = functools.partial(summed_over, mesh=mesh)

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        B, T, _ = x.shape
        H, nope, rope, vd = self.n_heads, self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim
        q_latent, q_up = None, x
        if self.q_lora_rank is not None:
            raw = self.q_a(x)
            q_latent = self.q_norm(raw)  # (B, T, q_lora_rank)
            q_up = torch.cat((q_latent, raw), dim=-1) if self.q_up_raw else q_latent  # (B, T, q_up_width)
        q = self.q_proj(x) if q_latent is None else self.q_b(q_up)
        gate_source = q_up if self.gate_from_query else x
        q = q.view(B, T, H, nope + rope).transpose(1, 2)  # (B, H, T, nope + rope)
        q_nope, q_rope = q.split((nope, rope), dim=-1)
        latent, k_rope = self.kv_a(x).split((self.kv_lora_rank, rope), dim=-1)
        latent = self.kv_norm(latent)[:, None]  # (B, 1, T, kv_lora_rank)
        k_rope = k_rope[:, None]  # (B, 1, T, rope): one rotary key for all heads

        positional, state = ctx.positional_for(self.layer_index), ctx.positional_state_for(self.layer_index)
        q_rope = positional.rotate(q_rope, state)
        k_rope = positional.rotate(k_rope, state)
        # The indexer reads its inputs detached: only its own loss trains it (DeepSeek-V3.2).
        index_keys = None if self.indexer is None else self.indexer.keys(x.detach(), positional, state)  # (B, 1, T, D)
        if ctx.cache is not None:
            # The cache keeps what this layer declares (cache_slots): the rotary key (and the indexer's
            # key after it) and the latent.
            key = k_rope if index_keys is None else torch.cat((k_rope, index_keys), dim=-1)
            key, latent, k_positions = ctx.cache.update(self.layer_index, key, latent, ctx.positions)
            k_rope, index_keys = (key, None) if index_keys is None else key.split((rope, index_keys.shape[-1]), dim=-1)
        else:
            k_positions = ctx.positions
        S = latent.shape[2]
        rule = MaskRule(window=self.window)
        if self.indexer is not None:
            self.indexer.aux_loss = None
        if self.indexer is not None and S > self.indexer.topk:
            if Scores(scale=self.scale, positional=positional, state=state).has_bias(ctx, k_positions):
                raise ValueError(f"layer {self.layer_index}: sparse attention (an indexer) adds no positional bias to "
                                 f"its scores, and {type(positional).__name__} biases them; use rope or none")
            query_source = x if q_latent is None else q_latent
            selections = self.indexer.selections(x, query_source, index_keys, ctx=ctx, k_positions=k_positions,
                                                 rule=rule, positional=positional, state=state)
            y = self._sparse(q_nope, q_rope, latent, k_rope, selections,
                             learn=self._indexer_learns(x, query_source, index_keys, positional, state))
            return self.out(self._gated(gate_source, y.transpose(1, 2)).reshape(B, T, H * vd))  # (B, T, H*vd)
        kv = self.kv_b(latent[:, 0]).view(B, S, H, nope + vd).transpose(1, 2)  # (B, H, S, nope + vd)
        k_nope, v = kv.split((nope, vd), dim=-1)
        k = torch.cat((k_nope, self.summed_over_heads(k_rope).expand(B, H, S, rope)), dim=-1)  # (B, H, S, nope + rope)
        q = torch.cat((q_nope, q_rope), dim=-1)  # (B, H, T, nope + rope)
        # The same kernels and mask rule as every attention; `backend` offers only sdpa and eager.
        # With an indexer and no more keys than it keeps, every allowed key is chosen: dense attention.
        y = attend(self.backend, ctx=ctx, q=q, k=k, v=v, k_positions=k_positions, rule=rule,
                   scores=Scores(scale=self.scale, positional=positional, state=state),
                   dropout=self.dropout if self.training else 0.0, observe=self.observe_weights)
        y = self._gated(gate_source, y.transpose(1, 2)).reshape(B, T, H * vd)  # (B, T, H*vd)
        return self.out(y)

    def _gated(self, source: Tensor, y: Tensor) -> Tensor:
        """``y`` ``(B, T, H, vd)`` times ``sigmoid(gate(source))`` per head or per channel (the sigmoid in float32 at
        least), or as is."""
        if self.gate is None:
            return y
        logits = self.gate(source)
        gate = torch.sigmoid(logits.to(torch.promote_types(logits.dtype, torch.float32))).to(y.dtype)  # (B, T, H[*vd])
        if self.gate_per_channel:
            return y * gate.view(y.shape)  # (B, T, H, vd): rows of the gate per head, vd each
        return y * gate[..., None]

    def _indexer_learns(self, x: Tensor, query_source: Tensor, index_keys: Tensor, positional: Any,
                        state: Any) -> Callable[..., None] | None:
        """While training: what adds each block's alignment loss to the indexer's ``aux_loss``; else None."""
        indexer = self.indexer
        if not (self.training and indexer.loss_coef and torch.is_grad_enabled()):
            return None
        q, weights = indexer.queries(x.detach(), query_source.detach(), positional, state)
        queries = x.shape[0] * x.shape[1]

        def add(rows: slice, chosen: Tensor, readable: Tensor, attention: Tensor) -> None:
            loss = indexer.alignment_loss(q[:, rows], weights[:, rows], index_keys, chosen=chosen, readable=readable,
                                          attention=self.attention_of_all_heads(attention)) * (indexer.loss_coef / queries)
            indexer.aux_loss = loss if indexer.aux_loss is None else indexer.aux_loss + loss

        return add

    def _sparse(self, q_nope: Tensor, q_rope: Tensor, latent: Tensor, k_rope: Tensor, selections: Any,
                learn: Callable[..., None] | None = None) -> Tensor:
        """Attention ``(B, H, T, vd)`` over the chosen keys, in the latent (MLA's absorbed form).

        ``q_nope . (W_uk c) = (W_uk^T q_nope) . c`` for a latent ``c``: the queries move into
        the latent space, so every head reads the same keys ``[c; k_rope]`` and values ``c``
        (one key head) and only a block's chosen latents are gathered, never each head's
        expanded keys; the output leaves the latent through ``W_uv`` afterwards.
        """
        H, nope, vd = self.n_heads, self.qk_nope_head_dim, self.v_head_dim
        up = local_share(self.kv_b.weight).view(H, nope + vd, self.kv_lora_rank)  # rows per head: [W_uk; W_uv]
        w_uk, w_uv = up.split((nope, vd), dim=1)
        q = torch.cat((torch.einsum("bhtn,hnc->bhtc", q_nope, w_uk), q_rope), dim=-1)  # (B, H, T, kv_lora + rope)
        k = self.summed_over_heads(torch.cat((latent, k_rope), dim=-1))  # (B, 1, S, kv_lora + rope)
        latent = k[..., : self.kv_lora_rank]  # the values: a view of the keys, so the kernel gathers them once
        dropout = self.dropout if self.training else 0.0
        if self.observe_weights is not None:
            # An inspector wants (B, H, T, S) probabilities: the written-out softmax over the chosen keys.
            mask = selected_mask(selections, batch=q.shape[0], queries=q.shape[2], keys=k.shape[2])
            y = eager(q, k, latent, mask=mask, bias=None, scores=Scores(scale=self.scale), dropout=dropout,
                      observe=self.observe_weights)
        else:
            y = blockwise(q, k, latent, selections=selections, scale=self.scale, dropout=dropout,
                          each=learn)  # (B, H, T, kv_lora)
        return torch.einsum("bhtc,hvc->bhtv", y, w_uv)  # (B, H, T, vd)

    def extra_repr(self) -> str:
        parts = [f"n_heads={self.n_heads}", f"kv_lora_rank={self.kv_lora_rank}", f"q_lora_rank={self.q_lora_rank}",
                 f"qk_nope_head_dim={self.qk_nope_head_dim}", f"qk_rope_head_dim={self.qk_rope_head_dim}",
                 f"v_head_dim={self.v_head_dim}", f"backend={self.backend}"]
        if self.gate is not None:
            parts.append(f"output_gate={'channel' if self.gate_per_channel else 'head'}"
                         + (", output_gate_input=query_latent" if self.gate_from_query else ""))
        if self.q_up_raw:
            parts.append("q_up_input=normed_and_raw")
        if self.window is not None:
            parts.append(f"window={self.window}")
        return ", ".join(parts)

    def init_weights(self, *, std: float, residual_std: float) -> None:
        projections = [self.kv_a, self.kv_b] + ([self.q_proj] if self.q_lora_rank is None else [self.q_a, self.q_b])
        projections += [self.gate] if self.gate is not None else []
        for linear in projections:
            nn.init.normal_(linear.weight, std=std)
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)
        nn.init.normal_(self.out.weight, std=residual_std)  # feeds the residual stream
        if self.out.bias is not None:
            nn.init.zeros_(self.out.bias)


def _unchanged(x: Tensor) -> Tensor:
    return x


def yarn_mscale(factor: float | None, mscale_all_dim: float) -> float:
    """DeepSeek's YaRN attention multiplier ``0.1 * mscale_all_dim * ln(factor) + 1`` (1 without YaRN)."""
    if factor is None or factor <= 1 or not mscale_all_dim:
        return 1.0
    return 0.1 * mscale_all_dim * math.log(factor) + 1.0
