"""Causal self-attention: multi-head, grouped-query and multi-query in one module."""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch import Tensor, nn

from specformer.model.attention import CacheSlots, head_sizes
from specformer.model.context import ForwardContext
from specformer.model.masks import MaskRule
from specformer.model.positional import PositionalScheme
from specformer.model.parallel_plan import ParallelPlan, Shared, Split, local_share

from specformer_layers.attention.differential import DifferentialHeads
from specformer_layers.attention.kernels import BACKENDS, Scores, attend, describe, eager, sdpa_dense
from specformer_layers.attention.masking import attention_mask
from specformer_layers.attention.params import CausalSelfAttentionParams
from specformer_layers.attention.per_head_norm import PerHeadNorm

def _linear_maker(params: Any) -> Callable[..., nn.Module]:
    """``make(d_in, d_out, bias=, splits=)``: an nn.Linear, or the ``linear`` component params names (any Params
    with a ``linear`` field); ``splits``, the rows of each projection a fused one holds, go to the component only."""
    if params.linear is None:
        return lambda d_in, d_out, *, bias, splits=(): nn.Linear(d_in, d_out, bias=bias)
    return lambda d_in, d_out, *, bias, splits=(): params.linear.make(in_features=d_in, out_features=d_out,
                                                                      bias=bias, splits=tuple(splits))


class CausalSelfAttention(nn.Module):
    """Causal self-attention, multi-head, grouped-query or multi-query: :class:`CausalSelfAttentionParams`.

    Setting ``observe_weights`` to a callable hands it the attention probabilities of
    every forward (the contract :func:`specformer_eval.capture` relies on).
    """

    Params = CausalSelfAttentionParams

    def __init__(self, params: CausalSelfAttentionParams, *, d_model: int, layer_index: int = 0) -> None:
        super().__init__()
        sizes = head_sizes(d_model=d_model, n_heads=params.n_heads, n_kv_heads=params.n_kv_heads,
                           head_dim=params.head_dim)
        n_heads, n_kv_heads, head_dim = sizes.n_heads, sizes.n_kv_heads, sizes.head_dim
        window, chunk, scale, backend = params.window, params.chunk, params.scale, params.backend
        # The public facts (specformer.model.attention.AttentionLayer) others read: heads, window, cache slot.
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.head_dim = head_dim
        # Values may be wider or narrower than queries and keys (MiMo-V2-Flash); scaled once projected.
        self.v_head_dim = v_head_dim = params.v_head_dim or head_dim
        self.value_scale = params.value_scale
        self.window = window
        self.logit_softcap = params.logit_softcap
        self.scale = scale if scale is not None else 1.0 / math.sqrt(head_dim)
        self.dropout = params.dropout
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        self.backend = backend
        self.chunk = chunk
        self.mask_rule = MaskRule(window=window, chunk=chunk)
        # gpt-oss's sinks: one logit per query head, a column of the softmax with no value.
        self.sinks = nn.Parameter(torch.zeros(n_heads)) if params.sinks else None
        self.layer_index = layer_index
        self.temperature = ((params.temperature_floor_scale, params.temperature_attn_scale, params.temperature_position_offset)
                            if params.temperature_tuning else None)
        self.length_scale = ((params.query_length_scale_base, params.query_length_scale_exponent)
                             if params.query_length_scale else None)
        self.qk_norm_scope = params.qk_norm_scope
        # Hunyuan-V1 normalises the rotated heads; the others normalise, then rotate.
        self.qk_norm_after_rope = params.qk_norm_order == "after_rope"
        q_norm, k_norm = _qk_norms(params, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim)
        # Cross-layer KV sharing: this layer reads layer kv_from's keys and values (ctx.shared_kv) and keeps none.
        self.kv_from = params.kv_from
        params.check_kv_from(layer_index)
        if self.kv_from is not None:
            self.cache_slots = None
            k_norm = None
        self.k_eq_v = params.k_eq_v
        self.clip_qkv = params.clip_qkv
        self.clip_after_qk_norm = params.clip_qkv_order == "after_qk_norm"
        # One matmul for q, k and v; rows are [q (n_heads*hd); k (n_kv*hd); v (n_kv*v_head_dim)], without the v rows
        # when the values are the keys (k_eq_v), and queries only when the keys and values are another layer's.
        self.kv_splits: tuple[int, ...] = (
            () if self.kv_from is not None
            else (n_kv_heads * head_dim,) if self.k_eq_v else (n_kv_heads * head_dim, n_kv_heads * v_head_dim))
        if v_head_dim != head_dim:  # the cache keeps values of their own width (kv_from is refused with v_head_dim)
            self.cache_slots = CacheSlots(key_heads=n_kv_heads, key_dim=head_dim, value_heads=n_kv_heads,
                                          value_dim=v_head_dim)
        # The projections are nn.Linear or the spec's linear kind (BitLinear): same weight and bias either way.
        make_linear = _linear_maker(params)
        d_in = params.input_width or d_model  # what the projections read (Zamba: concat(stream, embeddings))
        self.qkv = make_linear(d_in, n_heads * head_dim + sum(self.kv_splits), bias=params.qkv_bias,
                               splits=(n_heads * head_dim, *self.kv_splits))
        self.v_norm = params.v_norm.make(dim=v_head_dim) if params.v_norm is not None else None
        # BitNet's attn_sub_norm: over all heads' channels, between attention and the output projection.
        self.out_norm = params.out_norm.make(dim=n_heads * v_head_dim) if params.out_norm is not None else None
        self.out = make_linear(n_heads * v_head_dim, d_model, bias=params.out_bias)
        # The output gate reads the block input: one logit per output channel of every head, or per head (no bias).
        self.gate_per_head = params.output_gate_scope == "head"
        self.gate_activation = params.output_gate_activation
        if not params.output_gate:
            self.gate = None
        elif self.gate_per_head:
            self.gate = make_linear(d_in, n_heads, bias=False)
        else:
            head_bias = params.output_gate_bias == "head"
            self.gate = make_linear(d_in, n_heads * v_head_dim, bias=params.qkv_bias and not head_bias)
        # Beam's gate bias: one per head, added to each of the head's channel logits.
        self.gate_head_bias = (nn.Parameter(torch.zeros(n_heads))
                               if params.output_gate and params.output_gate_bias == "head" else None)
        self.q_norm = q_norm
        self.k_norm = k_norm
        # Differential attention: heads i and i + H/2 are pairs, combined after attention (lambda, norm, scale).
        self.differential = (DifferentialHeads(head_dim=head_dim, layer_index=layer_index,
                                               norm=params.differential_norm.make(dim=2 * head_dim))
                             if params.differential else None)
        # Sparse attention: a selector over this layer's own queries and keys (block_pooled) picks what each reads.
        self.indexer = None
        if params.indexer is not None:
            self.indexer = params.indexer.make(d_model=d_model, query_dim=n_heads * head_dim, positional_dim=0)
            self.indexer.check_heads(n_heads=n_heads, n_kv_heads=n_kv_heads)
            # For specformer summary (AttentionLayer): the keys a query reads, and per key of its span the work of
            # choosing them (each query pools the keys it may read, 2 * head_dim, then scores the block means).
            self.keys_read = self.indexer.keys_read
            scorers = self.indexer.n_heads or n_heads // n_kv_heads
            self.selection_flops_per_key = 2 * head_dim + 2 * scorers * head_dim // self.indexer.block_size
        # An inspector (specformer_eval.capture) sets this to receive the attention probabilities
        # (B, H, T, S) of each forward; while it is set the written-out softmax is used. None costs nothing.
        self.observe_weights: Callable[[Tensor], None] | None = None

    def parallel_plan(self) -> ParallelPlan:
        """Heads over tp: queries, keys and values by head (kv heads fewer than tp are copied), the output by its inputs."""
        H, hd = self.n_heads, self.head_dim
        heads = Split("tp", 0, H, "query heads", rows=H * hd)
        kv = tuple(Split("tp", 0, self.n_kv_heads, "key/value heads", rows=rows, copies_when_fewer=True)
                   for rows in self.kv_splits)
        plan: dict[str, tuple[Split | Shared, ...]] = {"qkv.weight": (heads, *kv), "qkv.bias": (heads, *kv),
                                                       "out.weight": (Split("tp", 1, H, "query heads"),),
                                                       "gate.weight": (Split("tp", 0, H, "query heads"),),
                                                       "gate.bias": (Split("tp", 0, H, "query heads"),),
                                                       "gate_head_bias": (Split("tp", 0, H, "query heads"),),
                                                       "sinks": (Split("tp", 0, H, "query heads"),)}
        # A norm applied to each head (qk_norm_scope: head, v_norm) is kept whole, each device applying it to its
        # own heads: their gradients are summed.
        for norm_name in ("q_norm", "k_norm", "v_norm"):
            norm = getattr(self, norm_name)
            if norm is not None and (norm_name == "v_norm" or self.qk_norm_scope == "head"):
                plan.update({f"{norm_name}.{p}": (Shared("tp"),) for p, _ in norm.named_parameters()})
        return plan  # the output bias: replicated

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        B, T, _ = x.shape
        H, hd = self.n_heads, self.head_dim
        qkv = self.qkv(x)
        if self.clip_qkv is not None and not self.clip_after_qk_norm:  # before norms and rotation (OLMo, DBRX)
            qkv = qkv.clamp(-self.clip_qkv, self.clip_qkv)
        q, *kv = qkv.split((H * hd, *self.kv_splits), dim=-1)
        if self.q_norm is not None and self.qk_norm_scope == "all":
            q = self.q_norm(q)
        if self.clip_after_qk_norm:  # queries after their norm over all heads (OLMoE); keys and values below
            q = q.clamp(-self.clip_qkv, self.clip_qkv)
        q = q.view(B, T, H, hd).transpose(1, 2)  # (B, H, T, hd)
        per_head_norm = self.q_norm is not None and self.qk_norm_scope != "all"  # head, per_head_weights
        if per_head_norm and not self.qk_norm_after_rope:
            q = self.q_norm(q)
        # This layer's own scheme (model.layers[].positional), its tables prepared once per forward.
        positional, state = ctx.positional_for(self.layer_index), ctx.positional_state_for(self.layer_index)
        q = positional.rotate(q, state)
        if per_head_norm and self.qk_norm_after_rope:
            q = self.q_norm(q)
        if self.temperature is not None:
            # Multiplied in float32 and rounded once, as transformers' Llama 4 does.
            q = (q * query_temperature(ctx.positions, *self.temperature)[:, None, :, None]).to(q.dtype)
        if self.length_scale is not None:
            # From each token's own position, so a cached decode step scales as the full forward; float32 as Beam's.
            q = (q * query_length_scale(ctx.positions, *self.length_scale)[:, None, :, None]).to(q.dtype)
        if self.kv_from is None:
            k, v, k_positions = self._own_keys_values(kv, ctx, positional, state)
        else:
            k, v, k_positions = self._shared_keys_values(ctx)
        # The positional bias (ALiBi) is handed over as the scheme itself: the dense kernels
        # build it, FlexAttention evaluates it per score (kernels.Scores.bias).
        scores = Scores(scale=self.scale, softcap=self.logit_softcap, sinks=local_share(self.sinks), positional=positional,
                        state=state)
        dropout = self.dropout if self.training else 0.0
        if self.indexer is not None:
            y = self._selected(q, k, v, ctx=ctx, k_positions=k_positions, scores=scores, dropout=dropout)
        elif self.differential is None:
            y = attend(self.backend, ctx=ctx, q=q, k=k, v=v, k_positions=k_positions, rule=self.mask_rule,
                       scores=scores, dropout=dropout, observe=self.observe_weights)
        else:
            # Two calls over the two value halves (one call over a value twice as wide would keep fused kernels
            # that need equal query and value widths from running); the second's weights equal the first's.
            first, second = self.differential.value_halves(v)
            y = torch.cat([attend(self.backend, ctx=ctx, q=q, k=k, v=half, k_positions=k_positions,
                                  rule=self.mask_rule, scores=scores, dropout=dropout, observe=observe)
                           for half, observe in ((first, self.observe_weights), (second, None))], dim=-1)
            y = self.differential(y)  # (B, H, T, 2hd) -> (B, H/2, T, 2hd): one output per pair
        y = y.transpose(1, 2)  # (B, T, H, vd), or (B, T, H/2, 2hd) with differential
        if self.gate is not None and self.gate_per_head:
            y = y * self._gates(x)[..., None]  # (B, T, H, 1): each head's output scaled as a whole
        y = y.reshape(B, T, H * self.v_head_dim)  # (B, T, H*vd): a pair's 2hd channels in place of its two heads' hd
        if self.gate is not None and not self.gate_per_head:
            y = y * self._gates(x)
        if self.out_norm is not None:
            y = self.out_norm(y)
        return self.out(y)

    def _selected(self, q: Tensor, k: Tensor, v: Tensor, *, ctx: ForwardContext, k_positions: Tensor,
                  scores: Scores, dropout: float) -> Tensor:
        """Attention ``(B, H, T, vd)`` over the keys the indexer chose: the rule's mask and the selection together,
        through SDPA with that dense mask (the written-out softmax with ``backend: eager`` or an inspector)."""
        assert self.indexer is not None
        selected = self.indexer.select(q, k, ctx=ctx, k_positions=k_positions, rule=self.mask_rule)  # (B, 1, T, S)
        mask = attention_mask(ctx, k_positions, self.mask_rule) & selected
        bias = scores.bias(ctx.positions, k_positions)
        if self.backend == "eager" or self.observe_weights is not None:
            return eager(q, k, v, mask=mask, bias=bias, scores=scores, dropout=dropout, observe=self.observe_weights)
        return sdpa_dense(q, k, v, mask=mask, bias=bias, scores=scores, dropout=dropout)

    def _gates(self, x: Tensor) -> Tensor:
        """The output gates of the block input ``x``: sigmoid or softplus of its gate projection."""
        assert self.gate is not None
        logits = self.gate(x)
        if self.gate_head_bias is not None:
            B, T, _ = logits.shape
            # (B, T, H*vd) -> (B, T, H, vd): the head's bias on each of its channels
            logits = (logits.view(B, T, self.n_heads, -1) + local_share(self.gate_head_bias)[:, None]).view(B, T, -1)
        return torch.sigmoid(logits) if self.gate_activation == "sigmoid" else torch.nn.functional.softplus(logits)

    def _own_keys_values(self, kv: list[Tensor], ctx: ForwardContext, positional: PositionalScheme, state: object) -> tuple[Tensor, Tensor, Tensor]:
        """This layer's keys and values (through the cache, if any) and their positions; handed on to the layers
        that read them (``ctx.shared_kv``)."""
        B, T, _ = kv[0].shape
        KV, hd, vd = self.n_kv_heads, self.head_dim, self.v_head_dim
        k = kv[0]
        v = k if self.k_eq_v else kv[1]  # k_eq_v: the values are the keys before their norm and rotation
        if self.k_norm is not None and self.qk_norm_scope == "all":
            k = self.k_norm(k)
        if self.clip_after_qk_norm:  # the keys after their norm, the values as projected
            k, v = k.clamp(-self.clip_qkv, self.clip_qkv), v.clamp(-self.clip_qkv, self.clip_qkv)
        k = k.view(B, T, KV, hd).transpose(1, 2)  # (B, KV, T, hd)
        v = v.view(B, T, KV, vd).transpose(1, 2)  # (B, KV, T, vd)
        per_head_norm = self.k_norm is not None and self.qk_norm_scope != "all"
        if per_head_norm and not self.qk_norm_after_rope:
            k = self.k_norm(k)
        if self.v_norm is not None:
            v = self.v_norm(v)
        if self.value_scale != 1.0:  # before the cache, which keeps the values as attention reads them
            v = v * self.value_scale
        k = positional.rotate(k, state)
        if per_head_norm and self.qk_norm_after_rope:  # before the cache: it keeps keys as attention reads them
            k = self.k_norm(k)
        if ctx.cache is not None:
            k, v, k_positions = ctx.cache.update(self.layer_index, k, v, ctx.positions)  # (B, KV, S, hd)
        else:
            k_positions = ctx.positions
        if self.layer_index in ctx.shared_kv:  # a later layer reads these (its kv_from)
            ctx.shared_kv[self.layer_index] = (k, v, k_positions)
        return k, v, k_positions

    def _shared_keys_values(self, ctx: ForwardContext) -> tuple[Tensor, Tensor, Tensor]:
        """What layer ``kv_from`` attended to in this forward (keys, values, their positions)."""
        shared = ctx.shared_kv.get(self.kv_from)
        if shared is None:
            raise RuntimeError(f"layer {self.layer_index} reads layer {self.kv_from}'s keys and values, which this forward "
                               f"did not keep: the Decoder keeps them for the kv_from its blocks' attention declare")
        return shared

    def take_tensor_parallel_share(self, mesh: Any) -> None:
        """Compute on ``n_heads / tp`` query heads and ``n_kv_heads / tp`` key/value heads (one copied key/value head
        when they are fewer than ``tp``), ``tp`` the size of ``mesh`` (:mod:`specformer.model.tensor_parallel`; the
        weights are cut as :meth:`parallel_plan` declares)."""
        if self.indexer is not None:
            raise ValueError("tensor parallelism does not split attention with an indexer: it scores with the first "
                             "query heads, and every device must choose the same keys (transformers' Kolibri 1.1 "
                             "does not shard these heads either)")
        if self.differential is not None:
            raise ValueError("tensor parallelism does not split differential attention yet: head i pairs with head "
                             "i + n_heads/2, which a split into consecutive heads puts on another device")
        if self.out_norm is not None or not type(self.qkv) is nn.Linear:
            raise ValueError("tensor parallelism does not split attention with out_norm or a linear kind yet: the norm "
                             "and BitLinear's absmean and absmax scales read every head's channels, not one device's")
        if self.q_norm is not None and self.qk_norm_scope != "head":
            raise ValueError(f"tensor parallelism does not split attention with qk_norm_scope {self.qk_norm_scope!r} "
                             f"yet (a norm across all heads' channels, or weights per head); 'head' is split")
        tp = mesh.size()
        self.n_heads //= tp
        local_kv = max(1, self.n_kv_heads // tp)  # fewer key/value heads than tp: each process a copy of one
        self.kv_splits = tuple(size // self.n_kv_heads * local_kv for size in self.kv_splits)
        self.n_kv_heads = local_kv
        if hasattr(self, "cache_slots") and self.cache_slots is not None:  # values of their own width, fewer heads
            self.cache_slots = CacheSlots(key_heads=local_kv, key_dim=self.head_dim, value_heads=local_kv,
                                          value_dim=self.v_head_dim)

    def describe_kernel(self, *, bias: bool = False) -> str:
        """The kernel(s) this layer runs, in words (``specformer summary``); ``bias``: the scheme biases scores."""
        if self.indexer is not None:
            kernel = "eager" if self.backend == "eager" else "sdpa"
            return f"{kernel} with the indexer's chosen keys as a dense mask"
        return describe(backend=self.backend, rule=self.mask_rule, logit_softcap=self.logit_softcap,
                        sinks=self.sinks is not None, bias=bias)

    def extra_repr(self) -> str:
        parts = [f"n_heads={self.n_heads}", f"n_kv_heads={self.n_kv_heads}", f"head_dim={self.head_dim}",
                 f"backend={self.backend}"]
        if self.v_head_dim != self.head_dim:
            parts.append(f"v_head_dim={self.v_head_dim}")
        if self.value_scale != 1.0:
            parts.append(f"value_scale={self.value_scale}")
        if self.window is not None:
            parts.append(f"window={self.window}")
        if self.chunk is not None:
            parts.append(f"chunk={self.chunk}")
        if self.logit_softcap is not None:
            parts.append(f"logit_softcap={self.logit_softcap}")
        if self.sinks is not None:
            parts.append("sinks=True")
        if self.gate is not None:
            parts.append("output_gate=head" if self.gate_per_head else "output_gate=True")
            if self.gate_head_bias is not None:
                parts.append("output_gate_bias=head")
            if self.gate_activation != "sigmoid":
                parts.append(f"output_gate_activation={self.gate_activation}")
        if self.temperature is not None:
            parts.append(f"temperature_tuning=(floor_scale={self.temperature[0]}, attn_scale={self.temperature[1]}"
                         + (f", position_offset={self.temperature[2]})" if self.temperature[2] != 1 else ")"))
        if self.length_scale is not None:
            parts.append(f"query_length_scale=(base={self.length_scale[0]}, exponent={self.length_scale[1]})")
        if self.kv_from is not None:
            parts.append(f"kv_from={self.kv_from}")
        if self.k_eq_v:
            parts.append("k_eq_v=True")
        if self.clip_qkv is not None:
            parts.append(f"clip_qkv={self.clip_qkv}" + (", clip_qkv_order=after_qk_norm" if self.clip_after_qk_norm else ""))
        if self.qk_norm_after_rope:
            parts.append("qk_norm_order=after_rope")
        if self.differential is not None:
            parts.append("differential=True")
        if self.indexer is not None:
            parts.append("indexer=block_pooled")
        if self.out_norm is not None:
            parts.append("out_norm=True")
        if type(self.qkv) is not nn.Linear:
            parts.append(f"linear={type(self.qkv).__name__}")
        return ", ".join(parts)

    def init_weights(self, *, std: float, residual_std: float) -> None:
        nn.init.normal_(self.qkv.weight, std=std)
        if self.gate is not None:
            nn.init.normal_(self.gate.weight, std=std)
        nn.init.normal_(self.out.weight, std=residual_std)  # feeds the residual stream
        if self.sinks is not None:
            nn.init.normal_(self.sinks, std=std)  # as transformers initialises gpt-oss's sinks
        for bias in (self.qkv.bias, self.out.bias, self.gate.bias if self.gate is not None else None,
                     self.gate_head_bias):
            if bias is not None:
                nn.init.zeros_(bias)


def query_temperature(positions: Tensor, floor_scale: float, attn_scale: float, offset: int = 1) -> Tensor:
    """Llama 4's query multiplier ``(B, T)`` from absolute positions: ``1 + attn_scale * ln(1 + floor((p + offset) /
    floor_scale))``; ``offset`` 1 is Llama 4's (positions counted from 1), 0 Ministral 3's.

    Computed from each token's own position (not its slot in the batch), so a left-padded row
    or a cached decode step scales a token exactly as a forward over the whole row would;
    padding (negative positions) gets 1.
    """
    steps = torch.floor((positions.clamp(min=0).float() + float(offset)) / floor_scale)
    return torch.log1p(steps) * attn_scale + 1.0


def _qk_norms(params: CausalSelfAttentionParams, *, n_heads: int, n_kv_heads: int,
              head_dim: int) -> tuple[nn.Module | None, nn.Module | None]:
    """``qk_norm`` (a norm component) made twice, sized by the heads as ``qk_norm_scope`` says; or no norms."""
    if params.qk_norm is None:
        return None, None
    # Per head, each norm spans head_dim channels (one shared, or one per head: H of them for
    # queries, n_kv for keys); over all heads, the whole projection.
    if params.qk_norm_scope == "head":
        return params.qk_norm.make(dim=head_dim), params.qk_norm.make(dim=head_dim)
    if params.qk_norm_scope == "per_head_weights":
        return (PerHeadNorm([params.qk_norm.make(dim=head_dim) for _ in range(n_heads)]),
                PerHeadNorm([params.qk_norm.make(dim=head_dim) for _ in range(n_kv_heads)]))
    return params.qk_norm.make(dim=n_heads * head_dim), params.qk_norm.make(dim=n_kv_heads * head_dim)


def query_length_scale(positions: Tensor, base: float, exponent: float) -> Tensor:
    """Beam's query multiplier ``(B, T)`` from absolute positions: ``(1 + (p + 1) / base) ^ exponent``, computed in
    float32 as ``exp(exponent * log1p((p + 1) / base))``; padding (negative positions) gets 1."""
    scale = torch.exp(exponent * torch.log1p((positions.float() + 1.0) / base))
    return torch.where(positions < 0, torch.ones_like(scale), scale)
