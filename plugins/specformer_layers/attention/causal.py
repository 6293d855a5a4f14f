"""Causal self-attention: multi-head, grouped-query and multi-query in one module."""

from __future__ import annotations

import math
from typing import Callable, Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor, nn

from specformer.attention import head_sizes
from specformer.context import ForwardContext
from specformer.masks import MaskRule
from specformer.params import Params, SubComponent

from specformer_layers.attention.kernels import BACKENDS, Scores, attend, describe
from specformer_layers.attention.per_head_norm import PerHeadNorm

#: Where qk_norm's statistics and weights span (CausalSelfAttention.Params.qk_norm_scope).
QK_NORM_SCOPES = ("head", "per_head_weights", "all")


class CausalSelfAttention(nn.Module):
    """Scaled dot-product attention over earlier tokens, with ``n_kv_heads`` shared key/value heads.

    ``n_kv_heads`` = ``n_heads`` is multi-head attention (Vaswani et al. 2017), 1 is
    multi-query (Shazeer 2019), anything between that divides ``n_heads`` is grouped-query
    (Ainslie et al. 2023). ``window`` limits each query to the last ``window`` tokens
    (sliding window, Mistral); ``qk_norm`` normalises queries and keys before RoPE, per
    head (``qk_norm_scope: head``, Qwen3, Gemma 3), per head with separate weights for
    every head (``per_head_weights``, StableLM 2 12B) or over all heads at once (``all``,
    OLMo-2); ``logit_softcap`` bounds scores smoothly (Gemma 2); ``scale`` replaces
    ``1/sqrt(head_dim)`` (Gemma 2's ``query_pre_attn_scalar ** -0.5``); ``chunk`` limits
    each query to its own block of ``chunk`` positions (Llama 4's local layers); ``sinks``
    adds a learned per-head logit to the softmax normalisation (gpt-oss), so a head may
    attend to nothing. ``backend`` picks the kernel (:mod:`.kernels`): ``auto`` uses the
    fused causal kernel where the mask is plain causal and FlexAttention (block-sparse,
    no ``T x T`` tensor) for every other mask and score modification where it can run;
    ``sdpa`` always uses PyTorch's SDPA (a dense mask when not plain causal); ``flex``
    FlexAttention; ``eager`` writes the softmax out and is the reference. All give the
    same results.
    Setting ``observe_weights`` to a callable hands it the attention probabilities of
    every forward (the contract :func:`specformer_eval.capture` relies on).
    """

    class Params(Params):
        n_heads: int = Field(gt=0, description="Number of query heads.")
        n_kv_heads: int | None = Field(default=None, gt=0, description="Key/value heads; default n_heads (MHA). 1 = MQA.")
        head_dim: int | None = Field(default=None, gt=0, description="Channels per head; default d_model / n_heads.")
        qkv_bias: bool = Field(default=False, description="Biases on the query/key/value projections.")
        out_bias: bool = Field(default=False, description="Bias on the output projection.")
        window: int | None = Field(default=None, gt=0, description="Sliding window: attend to at most this many latest tokens.")
        qk_norm: SubComponent("norm") | None = Field(default=None, description="A norm applied to queries and keys (before RoPE).")
        qk_norm_scope: Literal["head", "per_head_weights", "all"] = Field(
            default="head",
            description="head: qk_norm over each head's channels, one weight shared by the heads (Qwen3); "
                        "per_head_weights: the same with a separate weight for every head (StableLM 2 12B); "
                        "all: over all heads' channels at once (OLMo-2).",
        )
        logit_softcap: float | None = Field(default=None, gt=0, description="Scores become cap * tanh(scores / cap).")
        scale: float | None = Field(default=None, gt=0, description="Score scale; default 1 / sqrt(head_dim).")
        dropout: float = Field(default=0.0, ge=0, lt=1, description="Dropout on attention weights (training only).")
        chunk: int | None = Field(default=None, gt=0, description="Chunked local attention: attend only within the same block of this many positions (Llama 4).")
        sinks: bool = Field(default=False, description="Learned per-head sink logits that join the softmax normalisation (gpt-oss).")
        backend: Literal["auto", "sdpa", "flex", "eager"] = Field(
            default="auto",
            description="auto: fused causal SDPA where plain causal, FlexAttention otherwise; sdpa: SDPA, dense masks; "
                        "flex: FlexAttention; eager: explicit softmax (the reference).",
        )

        @model_validator(mode="after")
        def _kv_heads_divide(self) -> "CausalSelfAttention.Params":
            if self.n_kv_heads is not None and self.n_heads % self.n_kv_heads:
                raise ValueError(f"n_kv_heads ({self.n_kv_heads}) must divide n_heads ({self.n_heads})")
            return self

    def __init__(
        self,
        *,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        head_dim: int | None = None,
        qkv_bias: bool = False,
        out_bias: bool = False,
        window: int | None = None,
        q_norm: nn.Module | None = None,
        k_norm: nn.Module | None = None,
        qk_norm_scope: str = "head",
        logit_softcap: float | None = None,
        scale: float | None = None,
        dropout: float = 0.0,
        chunk: int | None = None,
        sinks: bool = False,
        backend: str = "auto",
        layer_index: int = 0,
    ) -> None:
        super().__init__()
        sizes = head_sizes(d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim)
        n_kv_heads, head_dim = sizes.n_kv_heads, sizes.head_dim
        # The public facts (specformer.attention.AttentionLayer) others read: heads, window, cache slot.
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.head_dim = head_dim
        self.window = window
        self.logit_softcap = logit_softcap
        self.scale = scale if scale is not None else 1.0 / math.sqrt(head_dim)
        self.dropout = dropout
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        self.backend = backend
        self.chunk = chunk
        self.mask_rule = MaskRule(window=window, chunk=chunk)
        # gpt-oss's sinks: one logit per query head, a column of the softmax with no value.
        self.sinks = nn.Parameter(torch.zeros(n_heads)) if sinks else None
        self.layer_index = layer_index
        if (q_norm is None) != (k_norm is None):
            raise ValueError("give both q_norm and k_norm, or neither")
        if qk_norm_scope not in QK_NORM_SCOPES:
            raise ValueError(f"qk_norm_scope must be one of {', '.join(QK_NORM_SCOPES)}, got {qk_norm_scope!r}")
        if qk_norm_scope == "per_head_weights" and q_norm is not None and not (
                isinstance(q_norm, PerHeadNorm) and isinstance(k_norm, PerHeadNorm)
                and (len(q_norm), len(k_norm)) == (n_heads, n_kv_heads)):
            raise ValueError(f"qk_norm_scope 'per_head_weights' needs q_norm and k_norm as PerHeadNorm of {n_heads} "
                             f"and {n_kv_heads} norms (one per query and per key head)")
        self.qk_norm_scope = qk_norm_scope
        # One matmul for q, k and v; rows are [q (n_heads*hd); k (n_kv*hd); v (n_kv*hd)].
        self.qkv = nn.Linear(d_model, (n_heads + 2 * n_kv_heads) * head_dim, bias=qkv_bias)
        self.out = nn.Linear(n_heads * head_dim, d_model, bias=out_bias)
        self.q_norm = q_norm
        self.k_norm = k_norm
        # An inspector (specformer_eval.capture) sets this to receive the attention probabilities
        # (B, H, T, S) of each forward; while it is set the written-out softmax is used. None costs nothing.
        self.observe_weights: Callable[[Tensor], None] | None = None

    @classmethod
    def from_params(cls, params: Params, *, d_model: int, layer_index: int, n_layers: int) -> "CausalSelfAttention":
        """The one transformation: ``qk_norm`` (a norm component) becomes two norms sized by the heads."""
        sizes = head_sizes(d_model=d_model, n_heads=params.n_heads, n_kv_heads=params.n_kv_heads, head_dim=params.head_dim)
        q_norm = k_norm = None
        if params.qk_norm is not None:
            # Per head, each norm spans head_dim channels (one shared, or one per head: H of them for
            # queries, n_kv for keys); over all heads, the whole projection.
            if params.qk_norm_scope == "head":
                q_norm, k_norm = params.qk_norm.make(dim=sizes.head_dim), params.qk_norm.make(dim=sizes.head_dim)
            elif params.qk_norm_scope == "per_head_weights":
                q_norm = PerHeadNorm([params.qk_norm.make(dim=sizes.head_dim) for _ in range(params.n_heads)])
                k_norm = PerHeadNorm([params.qk_norm.make(dim=sizes.head_dim) for _ in range(sizes.n_kv_heads)])
            else:
                q_norm = params.qk_norm.make(dim=sizes.n_heads * sizes.head_dim)
                k_norm = params.qk_norm.make(dim=sizes.n_kv_heads * sizes.head_dim)
        others = {name: getattr(params, name) for name in type(params).model_fields if name != "qk_norm"}
        return cls(d_model=d_model, q_norm=q_norm, k_norm=k_norm, layer_index=layer_index, **others)

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        B, T, _ = x.shape
        H, KV, hd = self.n_heads, self.n_kv_heads, self.head_dim
        q, k, v = self.qkv(x).split((H * hd, KV * hd, KV * hd), dim=-1)
        if self.q_norm is not None and self.qk_norm_scope == "all":
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(B, T, H, hd).transpose(1, 2)  # (B, H, T, hd)
        k = k.view(B, T, KV, hd).transpose(1, 2)  # (B, KV, T, hd)
        v = v.view(B, T, KV, hd).transpose(1, 2)  # (B, KV, T, hd)
        if self.q_norm is not None and self.qk_norm_scope != "all":  # head, per_head_weights
            q, k = self.q_norm(q), self.k_norm(k)
        # This layer's own scheme (model.layers[].positional), its tables prepared once per forward.
        positional, state = ctx.positional_for(self.layer_index), ctx.positional_state_for(self.layer_index)
        q = positional.rotate(q, state)
        k = positional.rotate(k, state)
        if ctx.cache is not None:
            k, v, k_positions = ctx.cache.update(self.layer_index, k, v, ctx.positions)  # (B, KV, S, hd)
        else:
            k_positions = ctx.positions
        # The positional bias (ALiBi) is handed over as the scheme itself: the dense kernels
        # build it, FlexAttention evaluates it per score (kernels.Scores.bias).
        scores = Scores(scale=self.scale, softcap=self.logit_softcap, sinks=self.sinks, positional=positional,
                        state=state)
        y = attend(self.backend, ctx=ctx, q=q, k=k, v=v, k_positions=k_positions, rule=self.mask_rule,
                   scores=scores, dropout=self.dropout if self.training else 0.0, observe=self.observe_weights)
        y = y.transpose(1, 2).reshape(B, T, H * hd)  # (B, T, H*hd)
        return self.out(y)

    def describe_kernel(self, *, bias: bool = False) -> str:
        """The kernel(s) this layer runs, in words (``specformer summary``); ``bias``: the scheme biases scores."""
        return describe(backend=self.backend, rule=self.mask_rule, logit_softcap=self.logit_softcap,
                        sinks=self.sinks is not None, bias=bias)

    def extra_repr(self) -> str:
        parts = [f"n_heads={self.n_heads}", f"n_kv_heads={self.n_kv_heads}", f"head_dim={self.head_dim}",
                 f"backend={self.backend}"]
        if self.window is not None:
            parts.append(f"window={self.window}")
        if self.chunk is not None:
            parts.append(f"chunk={self.chunk}")
        if self.logit_softcap is not None:
            parts.append(f"logit_softcap={self.logit_softcap}")
        if self.sinks is not None:
            parts.append("sinks=True")
        return ", ".join(parts)

    def init_weights(self, *, std: float, residual_std: float) -> None:
        nn.init.normal_(self.qkv.weight, std=std)
        nn.init.normal_(self.out.weight, std=residual_std)  # feeds the residual stream
        if self.sinks is not None:
            nn.init.normal_(self.sinks, std=std)  # as transformers initialises gpt-oss's sinks
        for bias in (self.qkv.bias, self.out.bias):
            if bias is not None:
                nn.init.zeros_(bias)
