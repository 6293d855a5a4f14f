"""The settings of Kimi Delta Attention, importable without torch (listing components reads only these)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from specformer.registry.params import Params, Sized
from specformer_layers.mixers.conv_params import ConvTaps

#: A projection's width: a rank (two Linears through a bottleneck) or ``full`` (one Linear, no bottleneck).
ProjectionRank = Annotated[int, Field(gt=0)] | Literal["full"]


class KimiDeltaAttentionParams(Params):
    """Kimi Delta Attention (KDA): a gated delta rule whose forgetting is per key channel (Kimi Team 2025, arXiv:2510.26692).

    Each head keeps a ``head_dim x value_head_dim`` matrix state ``S``. Per token, queries,
    keys and values come from one projection through a short depthwise causal convolution
    (kernel ``conv_kernel``, SiLU); queries and keys are L2-normalised per head and the
    queries scaled by ``1/sqrt(head_dim)``. The state first forgets per key channel,
    ``S <- diag(exp(a_t)) S`` with ``a_t = -exp(A_log) * softplus(f_b(f_a(x)) + dt_bias)``
    (a low-rank projection of width ``decay_rank``), then takes a delta-rule write of
    strength ``beta_t = sigmoid(b . x)``: ``S <- S + beta_t k_t (v_t - S^T k_t)^T``; the
    output is ``S^T q_t``. Each head's output passes an RMSNorm (eps ``norm_eps``, one
    weight shared by the heads) gated by ``sigmoid(g_b(g_a(x)))`` (a low-rank projection of
    width ``gate_rank``) before the output projection. Training and prefill run the chunked
    form (``chunk`` tokens per block); cached decoding runs the recurrence token by token.
    Both give the same results. A sequence's state is fixed in size: ``n_heads * head_dim *
    value_head_dim`` numbers and the convolution's last ``conv_kernel - 1`` inputs, whatever
    the context. Kimi Linear (Hugging Face ``kimi_linear``) interleaves it with latent
    attention (``mla``) through ``layers:`` overrides.

    ``decay_bound`` bounds the forgetting (Ling 3's KDA, Hugging Face ``bailing_hybrid``,
    ``kda_safe_gate``): ``a_t = decay_bound * sigmoid(exp(A_log) * (f(x) + dt_bias))``, so
    each channel's per-token log decay lies between ``decay_bound`` and 0 whatever the input
    (with the default gate a large input can drive it towards minus infinity).
    ``decay_rank: full`` and ``gate_rank: full`` project the decay and the output gate with
    one full ``d_model -> H*dk`` (``H*dv``) Linear each (``f``, ``g``) instead of the
    low-rank pair, as Ling 3 does.
    """

    n_heads: int = Field(gt=0, description="Number of heads, each with its own state matrix.")
    head_dim: int | None = Field(default=None, gt=0, description="Query/key channels per head; default d_model / n_heads.")
    value_head_dim: int | None = Field(default=None, gt=0, description="Value channels per head; default head_dim.")
    conv_kernel: ConvTaps = Field(default=4, description="Width of the short causal convolution on queries, keys and values "
                                                         "(at least 2).")
    conv_bias: bool = Field(default=False, description="A bias on the short convolution.")
    decay_rank: ProjectionRank | None = Field(
        default=None, description="Width of the low-rank decay projection (f_a, f_b); full: one d_model -> n_heads*head_dim "
                                  "Linear (f); default head_dim.")
    gate_rank: ProjectionRank | None = Field(
        default=None, description="Width of the low-rank output gate projection (g_a, g_b); full: one d_model -> "
                                  "n_heads*value_head_dim Linear (g); default value_head_dim.")
    decay_bound: float | None = Field(
        default=None, lt=0,
        description="Bounded forgetting (Ling 3's safe gate): each channel's log decay is decay_bound * "
                    "sigmoid(exp(A_log) * (f(x) + dt_bias)), in (decay_bound, 0); null: -exp(A_log) * softplus(f(x) + dt_bias).")
    norm_eps: float = Field(default=1e-6, gt=0, description="Epsilon of the gated output RMSNorm.")
    chunk: int = Field(default=64, gt=0, description="Tokens per block of the chunked (parallel) form.")

    def head_dims(self, d_model: int) -> tuple[int, int]:
        """``(head_dim, value_head_dim)`` for ``d_model``; ValueError when ``n_heads`` cannot split it."""
        if self.head_dim is None and d_model % self.n_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must divide d_model ({d_model}), or set head_dim")
        head_dim = self.head_dim or d_model // self.n_heads
        return head_dim, self.value_head_dim or head_dim

    def sized(self, *, d_model: int) -> Sized:
        H, K = self.n_heads, self.conv_kernel
        hd, vd = self.head_dims(d_model)
        channels = 2 * H * hd + H * vd
        parameters = (d_model * channels + channels * K + (channels if self.conv_bias else 0)  # qkv, conv
                      + _projection(d_model, self.decay_rank or hd, H * hd) + H + H * hd  # f_a, f_b (or f), A_log, dt_bias
                      + d_model * H + _projection(d_model, self.gate_rank or vd, H * vd)  # b, g_a, g_b (or g)
                      + vd + H * vd * d_model)  # the gated norm, out
        return Sized(parameters=parameters, n_heads=H, head_dim=hd, keeps_state=True)


def _projection(d_in: int, rank: int | Literal["full"], d_out: int) -> int:
    """Weights of a ``d_in -> d_out`` projection: one full Linear, or two through a ``rank``-wide bottleneck."""
    return d_in * d_out if rank == "full" else d_in * rank + rank * d_out
