"""Multi-head latent attention, MLA (DeepSeek-V2, DeepSeek-V3)."""

from __future__ import annotations

import math
from typing import Callable, Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor, nn

from specformer.attention import CacheSlots
from specformer.context import ForwardContext
from specformer.masks import MaskRule
from specformer.params import Params, SubComponent

from specformer_layers.attention.kernels import Scores, attend


class LatentAttention(nn.Module):
    """Keys and values rebuilt from one small latent per token, plus one rotary key shared by all heads.

    Each token is compressed to a latent of ``kv_lora_rank`` channels (normalised by
    ``latent_norm``) and a rotary key of ``qk_rope_head_dim`` channels shared by every head.
    Per head, the key is ``[k_nope; k_rope]``, with ``k_nope`` (``qk_nope_head_dim``) and
    the value (``v_head_dim``) expanded from the latent; the query is ``[q_nope; q_rope]``,
    projected from the input directly or, with ``q_lora_rank``, through a normalised
    low-rank bottleneck. Only the rotary parts carry positions (the layer's positional
    scheme is sized by ``qk_rope_head_dim``: set ``interleaved: true`` on its rope for
    DeepSeek-V3's layout). The generation cache keeps the latent and the rotary key:
    ``kv_lora_rank + qk_rope_head_dim`` values per token per layer, however many heads.
    Scores are scaled by ``scale`` (default ``1/sqrt(qk_nope_head_dim + qk_rope_head_dim)``),
    times ``(0.1 * yarn_mscale_all_dim * ln(yarn_factor) + 1)^2`` when ``yarn_factor`` is
    set, as DeepSeek does with YaRN (DeepSeek-AI 2024, arXiv:2405.04434; 2412.19437).
    """

    #: For caches that only know plain keys and values (they refuse a layer whose kind is not "kv").
    cache_kind = "latent"

    class Params(Params):
        n_heads: int = Field(gt=0, description="Number of query heads (each gets its own key and value from the latent).")
        kv_lora_rank: int = Field(gt=0, description="Channels of the compressed key/value latent (what the cache keeps).")
        qk_rope_head_dim: int = Field(gt=0, description="Rotary channels per head; one rotary key is shared by all heads.")
        qk_nope_head_dim: int = Field(ge=0, description="Channels per head of the query and key that carry no position.")
        v_head_dim: int = Field(gt=0, description="Channels per head of the values.")
        q_lora_rank: int | None = Field(default=None, gt=0, description="Low-rank query bottleneck; none: a full query projection (DeepSeek-V2-Lite).")
        latent_norm: SubComponent("norm") = Field(
            default="rmsnorm", validate_default=True,
            description="The norm of the key/value latent and of the query latent (q_lora_rank).",
        )
        bias: bool = Field(default=False, description="Biases on the down-projections and the output (DeepSeek's attention_bias).")
        window: int | None = Field(default=None, gt=0, description="Sliding window: attend to at most this many latest tokens.")
        scale: float | None = Field(default=None, gt=0, description="Score scale; default 1 / sqrt(qk_nope_head_dim + qk_rope_head_dim).")
        yarn_factor: float | None = Field(default=None, gt=0, description="YaRN factor of the rope: the score scale is multiplied by mscale^2 (DeepSeek).")
        yarn_mscale_all_dim: float = Field(default=0.0, ge=0, description="YaRN mscale_all_dim for that multiplier; 0 leaves the scale alone.")
        dropout: float = Field(default=0.0, ge=0, lt=1, description="Dropout on attention weights (training only).")
        backend: Literal["sdpa", "eager"] = Field(default="sdpa", description="sdpa: fused kernels; eager: explicit softmax.")

        @model_validator(mode="after")
        def _rotary_pairs(self) -> "LatentAttention.Params":
            if self.qk_rope_head_dim % 2:
                raise ValueError(f"qk_rope_head_dim ({self.qk_rope_head_dim}) must be even: rotary channels turn in pairs")
            return self

    def __init__(
        self,
        *,
        d_model: int,
        n_heads: int,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        qk_nope_head_dim: int,
        v_head_dim: int,
        kv_norm: nn.Module,
        q_lora_rank: int | None = None,
        q_norm: nn.Module | None = None,
        bias: bool = False,
        window: int | None = None,
        scale: float | None = None,
        yarn_factor: float | None = None,
        yarn_mscale_all_dim: float = 0.0,
        dropout: float = 0.0,
        backend: str = "sdpa",
        layer_index: int = 0,
    ) -> None:
        super().__init__()
        if qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim ({qk_rope_head_dim}) must be even: rotary channels turn in pairs")
        if (q_lora_rank is None) != (q_norm is None):
            raise ValueError("q_norm goes with q_lora_rank: give both or neither")
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        self.qk_nope_head_dim = qk_nope_head_dim
        self.qk_rope_head_dim = qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.kv_lora_rank = kv_lora_rank
        self.q_lora_rank = q_lora_rank
        # The public facts (specformer.attention.AttentionLayer): every head has its own key and
        # value once expanded; the positional scheme turns only the rotary channels; the cache
        # keeps the shared rotary key as "key" and the latent as "value".
        self.n_heads = n_heads
        self.n_kv_heads = n_heads
        self.head_dim = self.qk_head_dim
        self.positional_dim = qk_rope_head_dim
        self.cache_slots = CacheSlots(key_heads=1, key_dim=qk_rope_head_dim, value_heads=1, value_dim=kv_lora_rank)
        self.window = window
        self.layer_index = layer_index
        self.dropout = dropout
        self.backend = backend
        self.scale = (scale if scale is not None else 1.0 / math.sqrt(self.qk_head_dim)) * yarn_mscale(yarn_factor, yarn_mscale_all_dim) ** 2

        if q_lora_rank is None:
            self.q_proj = nn.Linear(d_model, n_heads * self.qk_head_dim, bias=False)
        else:
            self.q_a = nn.Linear(d_model, q_lora_rank, bias=bias)
            self.q_norm = q_norm
            self.q_b = nn.Linear(q_lora_rank, n_heads * self.qk_head_dim, bias=False)
        # Rows: [latent (kv_lora_rank); rotary key (qk_rope_head_dim)].
        self.kv_a = nn.Linear(d_model, kv_lora_rank + qk_rope_head_dim, bias=bias)
        self.kv_norm = kv_norm
        # Rows per head: [k_nope (qk_nope_head_dim); value (v_head_dim)].
        self.kv_b = nn.Linear(kv_lora_rank, n_heads * (qk_nope_head_dim + v_head_dim), bias=False)
        self.out = nn.Linear(n_heads * v_head_dim, d_model, bias=bias)
        # An inspector (specformer_eval.capture) sets this to receive the attention probabilities
        # (B, H, T, S) of each forward; while it is set the written-out softmax is used.
        self.observe_weights: Callable[[Tensor], None] | None = None

    @classmethod
    def from_params(cls, params: Params, *, d_model: int, layer_index: int, n_layers: int) -> "LatentAttention":
        """The one transformation: ``latent_norm`` becomes the latent's norm (and the query latent's)."""
        kv_norm = params.latent_norm.make(dim=params.kv_lora_rank)
        q_norm = params.latent_norm.make(dim=params.q_lora_rank) if params.q_lora_rank is not None else None
        others = {name: getattr(params, name) for name in type(params).model_fields if name != "latent_norm"}
        return cls(d_model=d_model, kv_norm=kv_norm, q_norm=q_norm, layer_index=layer_index, **others)

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        B, T, _ = x.shape
        H, nope, rope, vd = self.n_heads, self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim
        q = self.q_proj(x) if self.q_lora_rank is None else self.q_b(self.q_norm(self.q_a(x)))
        q = q.view(B, T, H, nope + rope).transpose(1, 2)  # (B, H, T, nope + rope)
        q_nope, q_rope = q.split((nope, rope), dim=-1)
        latent, k_rope = self.kv_a(x).split((self.kv_lora_rank, rope), dim=-1)
        latent = self.kv_norm(latent)[:, None]  # (B, 1, T, kv_lora_rank)
        k_rope = k_rope[:, None]  # (B, 1, T, rope): one rotary key for all heads

        positional, state = ctx.positional_for(self.layer_index), ctx.positional_state_for(self.layer_index)
        q_rope = positional.rotate(q_rope, state)
        k_rope = positional.rotate(k_rope, state)
        if ctx.cache is not None:
            # The cache keeps what this layer declares (cache_slots): the rotary key and the latent.
            k_rope, latent, k_positions = ctx.cache.update(self.layer_index, k_rope, latent, ctx.positions)
        else:
            k_positions = ctx.positions
        S = latent.shape[2]
        kv = self.kv_b(latent[:, 0]).view(B, S, H, nope + vd).transpose(1, 2)  # (B, H, S, nope + vd)
        k_nope, v = kv.split((nope, vd), dim=-1)
        k = torch.cat((k_nope, k_rope.expand(B, H, S, rope)), dim=-1)  # (B, H, S, nope + rope)
        q = torch.cat((q_nope, q_rope), dim=-1)  # (B, H, T, nope + rope)
        # The same kernels and mask rule as every attention; `backend` offers only sdpa and eager.
        y = attend(self.backend, ctx=ctx, q=q, k=k, v=v, k_positions=k_positions, rule=MaskRule(window=self.window),
                   scores=Scores(scale=self.scale, positional=positional, state=state),
                   dropout=self.dropout if self.training else 0.0, observe=self.observe_weights)
        y = y.transpose(1, 2).reshape(B, T, H * vd)  # (B, T, H*vd)
        return self.out(y)

    def extra_repr(self) -> str:
        parts = [f"n_heads={self.n_heads}", f"kv_lora_rank={self.kv_lora_rank}", f"q_lora_rank={self.q_lora_rank}",
                 f"qk_nope_head_dim={self.qk_nope_head_dim}", f"qk_rope_head_dim={self.qk_rope_head_dim}",
                 f"v_head_dim={self.v_head_dim}", f"backend={self.backend}"]
        if self.window is not None:
            parts.append(f"window={self.window}")
        return ", ".join(parts)

    def init_weights(self, *, std: float, residual_std: float) -> None:
        projections = [self.kv_a, self.kv_b] + ([self.q_proj] if self.q_lora_rank is None else [self.q_a, self.q_b])
        for linear in projections:
            nn.init.normal_(linear.weight, std=std)
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)
        nn.init.normal_(self.out.weight, std=residual_std)  # feeds the residual stream
        if self.out.bias is not None:
            nn.init.zeros_(self.out.bias)


def yarn_mscale(factor: float | None, mscale_all_dim: float) -> float:
    """DeepSeek's YaRN attention multiplier ``0.1 * mscale_all_dim * ln(factor) + 1`` (1 without YaRN)."""
    if factor is None or factor <= 1 or not mscale_all_dim:
        return 1.0
    return 0.1 * mscale_all_dim * math.log(factor) + 1.0
