"""The settings of compressed convolutional attention, importable without torch (listing components reads only these)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from specformer.model.attention import CacheSlots, head_sizes
from specformer.model.sized import linear
from specformer.registry.params import Params, Sized
from specformer_layers.mixers.conv_params import ConvTaps


class ConvolutionalAttentionParams(Params):
    """Compressed convolutional attention (CCA) as ZAYA1 runs it: queries and keys mixed over the last few tokens.

    Figliolia et al. 2025, *Compressed Convolutional Attention* (arXiv:2510.04476); Zyphra's
    ZAYA1 (transformers' ``zaya``). The queries ``q = W_q x`` (``n_heads`` heads) and keys
    ``k = W_k x`` (``n_kv_heads`` heads) are joined channel-wise and run through two causal
    convolutions over the sequence: a depthwise one of ``depthwise_kernel`` taps (each
    channel alone), then a grouped one of ``grouped_kernel`` taps whose groups are the heads
    (every channel of a head reads every channel of that head), both with a bias. Each side
    then gets a residual of the plain projections: with ``r_i = (q_i + k_{g(i)}) / 2`` for
    query head ``i`` and its key head ``g(i)``, the query is ``conv(q)_i + r_i`` and key head
    ``j`` is ``conv(k)_j + mean of r_i over the query heads that read it``. Values are
    two halves of ``n_kv_heads * head_dim`` channels, joined and then cut into heads:
    ``V_cur x_t`` and ``V_del x_{t-1}`` (the previous token's projection; before the first
    token, that of a zero input). Queries and keys are scaled to length ``sqrt(head_dim)``
    per head, each key head times a learned ``key_scale`` (ZAYA's ``temp``; initialised
    to one here, where ZAYA's zero would keep gradients from the queries and keys on a first step), turned by the layer's positional scheme and attended as the ``attention``
    mixer attends (scale ``1/sqrt(head_dim)``, ``window`` a sliding window).

    Besides the keys and values of every token, a cached sequence keeps a state of fixed
    size: the last ``depthwise_kernel + grouped_kernel - 2`` projected query/key inputs of
    the convolutions and the previous token's delayed value projection. Left padding is
    kept out of both, so a padded row gives what the row alone gives. Packed documents
    (``train.document_mask``) are refused: the convolutions would read across documents.
    """

    n_heads: int = Field(gt=0, description="Query heads.")
    n_kv_heads: int | None = Field(default=None, gt=0, description="Key/value heads; divides n_heads; default n_heads.")
    head_dim: int | None = Field(default=None, gt=0, description="Channels per head; default d_model / n_heads.")
    depthwise_kernel: ConvTaps = Field(default=2, description="Taps of the depthwise convolution (ZAYA's cca_time0).")
    grouped_kernel: ConvTaps = Field(default=2, description="Taps of the convolution grouped by heads (ZAYA's "
                                                            "cca_time1).")
    bias: bool = Field(default=False, description="Biases on the query, key, value and output projections "
                                                  "(ZAYA's attention_bias).")
    window: int | None = Field(default=None, gt=0, description="Sliding window in tokens; None: every earlier token.")
    backend: Literal["auto", "sdpa", "flex", "eager"] = Field(
        default="auto", description="The attention kernel, as the attention mixer's backend.",
    )

    @model_validator(mode="after")
    def _values_split_in_halves(self) -> "ConvolutionalAttentionParams":
        kv = self.n_kv_heads or self.n_heads
        if self.n_heads % kv:
            raise ValueError(f"cca: n_kv_heads ({kv}) must divide n_heads ({self.n_heads})")
        if self.head_dim is not None and (kv * self.head_dim) % 2:
            raise ValueError(f"cca: n_kv_heads * head_dim ({kv} * {self.head_dim}) must be even: the values are a "
                             f"current and a delayed half")
        return self

    def heads(self, d_model: int) -> tuple[int, int, int]:
        """``(n_heads, n_kv_heads, head_dim)`` for ``d_model``; ValueError when they do not fit."""
        sizes = head_sizes(d_model=d_model, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads, head_dim=self.head_dim)
        if (sizes.n_kv_heads * sizes.head_dim) % 2:
            raise ValueError(f"cca: n_kv_heads * head_dim ({sizes.n_kv_heads} * {sizes.head_dim}) must be even: the "
                             f"values are a current and a delayed half")
        return sizes.n_heads, sizes.n_kv_heads, sizes.head_dim

    @property
    def window_inputs(self) -> int:
        """Projected inputs the convolutions carry between forwards: ``depthwise_kernel + grouped_kernel - 2``."""
        return self.depthwise_kernel + self.grouped_kernel - 2

    def sized(self, *, d_model: int) -> Sized:
        H, KV, hd = self.heads(d_model)
        channels = (H + KV) * hd  # the convolutions' channels: every query head, then every key head
        parameters = (
            linear(d_model, H * hd, bias=self.bias) + linear(d_model, KV * hd, bias=self.bias)  # queries, keys
            + 2 * linear(d_model, KV * hd // 2, bias=self.bias)  # current and delayed value halves
            + channels * self.depthwise_kernel + channels  # depthwise convolution and its bias
            + channels * hd * self.grouped_kernel + channels  # grouped by heads: hd inputs per output, and bias
            + KV  # key_scale
            + linear(H * hd, d_model, bias=self.bias)
        )
        return Sized(parameters=parameters, n_heads=H, n_kv_heads=KV, head_dim=hd, keeps_state=True,
                     uses_positions=True, caches_tokens=True,
                     slots=CacheSlots(key_heads=KV, key_dim=hd, value_heads=KV, value_dim=hd), window=self.window)


__all__ = ["ConvolutionalAttentionParams"]
