"""Compressed convolutional attention (ZAYA1): queries and keys convolved over the last tokens, values half delayed."""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specformer.model.attention import CacheSlots
from specformer.model.context import ForwardContext
from specformer.model.masks import MaskRule
from specformer.model.state import StateSlots

from specformer_layers.attention.cca_params import ConvolutionalAttentionParams
from specformer_layers.attention.kernels import BACKENDS, Scores, attend, describe
from specformer_layers.mixers.conv import _padding_first
from specformer_layers.mixers.documents import leading_padding
from specformer_layers.mixers.recurrent import with_state


class ConvolutionalAttention(nn.Module):
    """Compressed convolutional attention: :class:`ConvolutionalAttentionParams`.

    It keeps keys and values per token (``cache_slots``, as grouped-query attention) and a
    state per sequence (``state_slots``): ``conv`` ``(C, K)``, the last ``K`` projected
    query/key inputs of the convolutions (``C = (n_heads + n_kv_heads) * head_dim``), and
    ``value`` ``(n_kv_heads * head_dim / 2,)``, the last token's delayed value projection
    without its bias (so a fresh, all-zero state is the projection of a zero input).
    """

    Params = ConvolutionalAttentionParams

    def __init__(self, params: ConvolutionalAttentionParams, *, d_model: int, layer_index: int = 0) -> None:
        super().__init__()
        H, KV, hd = params.heads(d_model)
        if params.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {params.backend!r}")
        # The public facts (specformer.model.attention.AttentionLayer) others read.
        self.n_heads, self.n_kv_heads, self.head_dim = H, KV, hd
        self.window = params.window
        self.layer_index = layer_index
        self.backend = params.backend
        self.scale = 1.0 / math.sqrt(hd)
        self.mask_rule = MaskRule(window=params.window, chunk=None)
        self.kept = params.window_inputs
        channels = (H + KV) * hd
        half = KV * hd // 2
        self.cache_slots = CacheSlots(key_heads=KV, key_dim=hd, value_heads=KV, value_dim=hd)
        self.state_slots = StateSlots((("conv", (channels, self.kept)), ("value", (half,))))
        self.uses_positions = True  # rotary keys, though it keeps a state beside them

        self.q = nn.Linear(d_model, H * hd, bias=params.bias)
        self.k = nn.Linear(d_model, KV * hd, bias=params.bias)
        self.v_current = nn.Linear(d_model, half, bias=params.bias)
        self.v_delayed = nn.Linear(d_model, half, bias=params.bias)
        # Channels [queries (H*hd); keys (KV*hd)]. The depthwise convolution's weight is (C, depthwise_kernel), oldest
        # tap first; the one grouped by the H + KV heads keeps (C, hd * grouped_kernel), each row its output channel's
        # (C, hd, K) Conv1d weight flattened: input channel j of the head at tap i in column j * K + i. Both are 2-D
        # so that nothing takes them for stacked expert weights.
        self.depthwise_kernel, self.grouped_kernel = params.depthwise_kernel, params.grouped_kernel
        self.conv_weight = nn.Parameter(torch.empty(channels, params.depthwise_kernel))
        self.conv_bias = nn.Parameter(torch.empty(channels))
        self.group_weight = nn.Parameter(torch.empty(channels, hd * params.grouped_kernel))
        self.group_bias = nn.Parameter(torch.empty(channels))
        self._init_convs()
        self.key_scale = nn.Parameter(torch.ones(KV))
        self.out = nn.Linear(H * hd, d_model, bias=params.bias)
        # An inspector (specformer_eval.capture) sets this to receive the attention probabilities (B, H, T, S).
        self.observe_weights: Callable[[Tensor], None] | None = None

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        B, T, _ = x.shape
        H, KV, hd = self.n_heads, self.n_kv_heads, self.head_dim
        if ctx.document_ids is not None:
            raise ValueError("cca convolves its queries and keys along the whole row; it does not read packed "
                             "documents (train.document_mask)")
        # Left padding is kept out of the convolutions and the delayed values, as a recurrent mixer keeps it out.
        padding = None if ctx.cache is None and ctx.plain_causal else leading_padding(ctx.positions)
        if ctx.cache is None:
            y = self._attend(*self._project(x, state=None, padding=padding, steps=False)[0], ctx=ctx)
        else:
            # The keys go into the cache before the state is written: a layer keeping both claims the cache's
            # columns for this forward with its keys.
            def cached(before: dict[str, Tensor], keep: bool) -> tuple[Tensor, dict[str, Tensor], dict[str, Tensor] | None]:
                qkv, after, steps = self._project(x, state=before, padding=padding, steps=keep)
                return self._attend(*qkv, ctx=ctx), after, steps

            y = with_state(ctx, self, cached)
        return self.out(y.transpose(1, 2).reshape(B, T, H * hd))  # (B, H, T, hd) -> (B, T, H*hd)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, *, ctx: ForwardContext) -> Tensor:
        """Attention ``(B, H, T, hd)`` of queries ``(B, T, H, hd)`` over keys and values ``(B, T, KV, hd)`` (and the
        cache's)."""
        hd = self.head_dim
        # Queries and keys to length sqrt(hd) per head (float eps as ZAYA's clamp), the keys then scaled per head.
        q = q * (math.sqrt(hd) / q.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(q.dtype).eps))
        k = k * (math.sqrt(hd) / k.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(k.dtype).eps))
        k = k * self.key_scale[:, None]
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, heads, T, hd)
        positional, state = ctx.positional_for(self.layer_index), ctx.positional_state_for(self.layer_index)
        q, k = positional.rotate(q, state), positional.rotate(k, state)
        if ctx.cache is not None:
            k, v, k_positions = ctx.cache.update(self.layer_index, k, v, ctx.positions)  # (B, KV, S, hd)
        else:
            k_positions = ctx.positions
        scores = Scores(scale=self.scale, positional=positional, state=state)
        return attend(self.backend, ctx=ctx, q=q, k=k, v=v, k_positions=k_positions, rule=self.mask_rule,
                      scores=scores, observe=self.observe_weights)

    def _project(self, x: Tensor, *, state: dict[str, Tensor] | None, padding: Tensor | None,
                 steps: bool) -> tuple[tuple[Tensor, Tensor, Tensor], dict[str, Tensor], dict[str, Tensor] | None]:
        """Queries ``(B, T, H, hd)``, keys and values ``(B, T, KV, hd)`` of ``x`` after ``state`` (zeros when None),
        the state after the last real token and, with ``steps``, after every token (a padding token's: the one before)."""
        B, T, _ = x.shape
        H, KV, hd = self.n_heads, self.n_kv_heads, self.head_dim
        q, k = self.q(x), self.k(x)  # (B, T, H*hd), (B, T, KV*hd)
        channels = q.shape[-1] + k.shape[-1]
        window = x.new_zeros(B, channels, self.kept) if state is None else state["conv"].to(x.dtype)
        stream = torch.cat((window, torch.cat((q, k), dim=-1).transpose(1, 2)), dim=2)  # (B, C, K+T)
        if padding is not None:
            stream = _padding_first(stream, padding, self.kept)  # each row: zeros, its window, its tokens
        channels = stream.shape[1]
        depthwise = F.conv1d(stream, self.conv_weight[:, None], self.conv_bias, groups=channels)  # (B, C, T+gk-1)
        grouped = self.group_weight.view(channels, hd, self.grouped_kernel)  # (C, hd, K): Conv1d's layout
        mixed = F.conv1d(depthwise, grouped, self.group_bias, groups=H + KV).transpose(1, 2)  # (B, T, C)

        # The residual paths: r_i = (q_i + k_g(i)) / 2 per query head, the keys the mean of r over their group.
        group = H // KV
        q_heads = q.view(B, T, H, hd)
        k_heads = k.view(B, T, KV, hd)
        query_residual = (q_heads + k_heads.repeat_interleave(group, dim=2)) * 0.5  # (B, T, H, hd)
        key_residual = query_residual.view(B, T, KV, group, hd).mean(dim=3)  # (B, T, KV, hd)
        query = mixed[..., :H * hd].view(B, T, H, hd) + query_residual
        key = mixed[..., H * hd:].view(B, T, KV, hd) + key_residual

        # Values: the current half, then the previous token's delayed half (kept without its bias).
        delayed = F.linear(x, self.v_delayed.weight)  # (B, T, KV*hd/2)
        half = delayed.shape[-1]
        before = x.new_zeros(B, half) if state is None else state["value"].to(x.dtype)
        previous = torch.cat((before[:, :, None], delayed.transpose(1, 2)), dim=2)  # (B, half, 1+T)
        if padding is not None:
            previous = _padding_first(previous, padding, 1)
        shifted = previous[:, :, :T].transpose(1, 2)  # (B, T, half): token t reads the one before it
        if self.v_delayed.bias is not None:
            shifted = shifted + self.v_delayed.bias
        value = torch.cat((self.v_current(x), shifted), dim=-1).view(B, T, KV, hd)

        after = {"conv": stream[:, :, stream.shape[2] - self.kept:], "value": previous[:, :, -1]}
        per_token = None
        if steps:
            # After token t: the K inputs ending at t, and token t's delayed projection.
            conv_steps = stream.unfold(2, self.kept, 1)[:, :, 1:].permute(0, 2, 1, 3)  # (B, T, C, K)
            value_steps = previous[:, :, 1:].transpose(1, 2)  # (B, T, half)
            if padding is not None:
                is_padding = torch.arange(T, device=x.device)[None, :] < padding[:, None]  # (B, T)
                conv_steps = torch.where(is_padding[:, :, None, None], window[:, None], conv_steps)
                value_steps = torch.where(is_padding[:, :, None], before[:, None], value_steps)
            per_token = {"conv": conv_steps, "value": value_steps}
        return (query, key, value), after, per_token

    @torch.no_grad()
    def _init_convs(self) -> None:
        """Both convolutions as torch initialises a Conv1d (ZAYA keeps it): uniform within ``1/sqrt(fan-in)``."""
        for weight, bias in ((self.conv_weight, self.conv_bias), (self.group_weight, self.group_bias)):
            bound = 1.0 / math.sqrt(weight.shape[1])
            nn.init.uniform_(weight, -bound, bound)
            nn.init.uniform_(bias, -bound, bound)

    def take_tensor_parallel_share(self, mesh: Any) -> None:
        """Refused: the key residual averages across query heads, and the convolution's channels put every query head
        before every key head, which a split by heads would have to cut and rejoin."""
        raise ValueError("tensor parallelism does not split cca attention yet (its convolution holds all query heads "
                         "then all key heads, and each key averages its query heads)")

    def describe_kernel(self, *, bias: bool = False) -> str:
        """The kernel this layer runs, in words (``specformer summary``)."""
        return "torch causal convs (queries/keys), then " + describe(backend=self.backend, rule=self.mask_rule,
                                                                    logit_softcap=None, sinks=False, bias=bias)

    def extra_repr(self) -> str:
        parts = [f"n_heads={self.n_heads}", f"n_kv_heads={self.n_kv_heads}", f"head_dim={self.head_dim}",
                 f"kernels=({self.depthwise_kernel}, {self.grouped_kernel})",
                 f"backend={self.backend}"]
        if self.window is not None:
            parts.append(f"window={self.window}")
        return ", ".join(parts)

    def init_weights(self, *, std: float, residual_std: float) -> None:
        for linear in (self.q, self.k, self.v_current, self.v_delayed):
            nn.init.normal_(linear.weight, std=std)
        nn.init.normal_(self.out.weight, std=residual_std)  # feeds the residual stream
        self._init_convs()
        # ZAYA initialises its temp to zero; at zero every key is zero and no gradient reaches the queries, keys or
        # convolutions on the first step, so a model trained here starts from one (scores sqrt(hd) * cosine).
        nn.init.ones_(self.key_scale)
        for linear in (self.q, self.k, self.v_current, self.v_delayed, self.out):
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)


__all__ = ["ConvolutionalAttention"]
