"""The settings of Gated DeltaNet, importable without torch (listing components reads only these)."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from specformer.registry.params import Params, Sized
from specformer_layers.mixers.conv_params import ConvTaps


class GatedDeltaNetParams(Params):
    """Gated DeltaNet: a matrix memory per head, decayed by a learned gate and corrected towards each new key-value pair.

    Each of ``n_heads`` value heads keeps a state ``S`` (``key_head_dim x value_head_dim``);
    per token ``S <- (I - beta k k^T) exp(g) S + beta k v^T`` and the output is ``S^T q``
    (the gated delta rule, Yang, Kautz & Hatamizadeh 2024, arXiv:2412.06464), so the layer
    keeps a state of fixed size, whatever the context. Queries, keys and values come from
    one projection, go through a short causal depthwise convolution of ``conv_kernel``
    taps (SiLU after it), and queries and keys are L2-normalised (queries then scaled by
    ``key_head_dim ** -0.5``). ``n_key_heads`` query/key heads may serve several value heads
    each (like grouped-query attention: value head ``h`` reads key head
    ``h // (n_heads / n_key_heads)``). The write strength is ``beta = sigmoid(b x)``, or
    ``2 sigmoid(b x)`` with ``negative_eigenvalues`` (OLMo Hybrid), so the state may flip
    sign along a key; the decay is ``g = -exp(A_log) softplus(a x + dt_bias)`` per head.
    The output is ``RMSNorm(o) * silu(z x)`` per head (a gated norm, eps ``norm_eps``), then
    projected back. Without a cache (training, prefill) the rule runs by chunks of
    ``chunk`` tokens; cached forwards of a few tokens (decoding) run token by token.
    Qwen3-Next and Qwen3.5: the defaults (``norm_eps`` as the model's ``rms_norm_eps``);
    OLMo Hybrid: ``negative_eigenvalues: true``, ``norm_eps: 1.0e-5``,
    ``a_init_range: [0.0, 16.0]``, ``dt_init_range: [0.001, 0.1]``.
    """

    n_heads: int = Field(gt=0, description="Value heads: each keeps its own key_head_dim x value_head_dim state.")
    n_key_heads: int | None = Field(
        default=None, gt=0,
        description="Query/key heads, shared by n_heads / n_key_heads value heads each; must divide n_heads. "
                    "Default n_heads.",
    )
    key_head_dim: int | None = Field(default=None, gt=0, description="Channels per query/key head; default d_model / n_heads.")
    value_head_dim: int | None = Field(default=None, gt=0, description="Channels per value head; default key_head_dim.")
    conv_kernel: ConvTaps = Field(default=4, description="Taps of the causal depthwise convolution over queries, keys "
                                                         "and values (at least 2).")
    conv_bias: bool = Field(default=False, description="A bias on that convolution.")
    norm_eps: float = Field(default=1e-6, gt=0, description="Epsilon of the gated RMSNorm on each head's output.")
    negative_eigenvalues: bool = Field(
        default=False, description="beta = 2 sigmoid(b x), in (0, 2) instead of (0, 1): the update may reflect the "
                                   "state along a key (OLMo Hybrid's allow_neg_eigval).",
    )
    a_init_range: tuple[float, float] = Field(
        default=(0.01, 16.0), description="A (the decay rate, A_log = log A) is initialised uniform in this range.",
    )
    dt_init_range: tuple[float, float] | None = Field(
        default=None,
        description="None: dt_bias starts at 1 (Qwen3-Next). [min, max]: dt log-uniform in that range, floored at "
                    "dt_init_floor, and dt_bias = softplus^-1(dt) (Mamba's initialisation; OLMo Hybrid).",
    )
    dt_init_floor: float = Field(default=1e-4, gt=0, description="Smallest dt of that log-uniform initialisation.")
    chunk: int = Field(default=64, gt=0, description="Tokens per chunk of the chunked (parallel) form of the rule.")

    @field_validator("a_init_range")
    @classmethod
    def _a_range(cls, value: tuple[float, float]) -> tuple[float, float]:
        low, high = value
        if not 0 <= low <= high:
            raise ValueError("a_init_range must be [low, high] with 0 <= low <= high")
        return value

    @field_validator("dt_init_range")
    @classmethod
    def _dt_range(cls, value: tuple[float, float] | None) -> tuple[float, float] | None:
        if value is not None and not 0 < value[0] <= value[1]:
            raise ValueError("dt_init_range must be [min, max] with 0 < min <= max")
        return value

    @model_validator(mode="after")
    def _key_heads_divide(self) -> "GatedDeltaNetParams":
        if self.n_key_heads is not None and self.n_heads % self.n_key_heads:
            raise ValueError(f"n_key_heads ({self.n_key_heads}) must divide n_heads ({self.n_heads}): "
                             f"each query/key head serves a whole number of value heads")
        return self

    def head_sizes(self, d_model: int) -> tuple[int, int, int]:
        """``(key_heads, key_head_dim, value_head_dim)`` for ``d_model``; ValueError when ``n_heads`` cannot split it."""
        key_dim = self.key_head_dim
        if key_dim is None:
            if d_model % self.n_heads:
                raise ValueError(f"gated_deltanet: n_heads ({self.n_heads}) must divide d_model ({d_model}) "
                                 f"unless key_head_dim is given")
            key_dim = d_model // self.n_heads
        return self.n_key_heads or self.n_heads, key_dim, self.value_head_dim or key_dim

    def sized(self, *, d_model: int) -> Sized:
        value_heads, K = self.n_heads, self.conv_kernel
        key_heads, key_dim, value_dim = self.head_sizes(d_model)
        channels = 2 * key_heads * key_dim + value_heads * value_dim
        parameters = (d_model * channels + d_model * value_heads * value_dim + 2 * d_model * value_heads  # qkv, z, b, a
                      + channels * K + (channels if self.conv_bias else 0) + 2 * value_heads  # conv, A_log, dt_bias
                      + value_dim + value_heads * value_dim * d_model)  # the gated norm, out
        return Sized(parameters=parameters, n_heads=value_heads, n_kv_heads=key_heads, head_dim=value_dim, keeps_state=True)


__all__ = ["GatedDeltaNetParams"]
