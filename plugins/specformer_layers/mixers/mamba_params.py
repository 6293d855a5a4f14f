"""The settings of Mamba-1's mixer, importable without torch (listing components reads only these)."""

from __future__ import annotations

import math

from pydantic import Field, model_validator

from specformer.registry.params import Params, Sized
from specformer.model.sized import linear
from specformer_layers.mixers.conv_params import ConvTaps


def default_dt_rank(d_model: int) -> int:
    """Mamba's ``dt_rank: "auto"``: ``ceil(d_model / 16)``."""
    return math.ceil(d_model / 16)


class MambaParams(Params):
    """Mamba-1's selective state-space mixer (Gu & Dao 2023, "Mamba", arXiv:2312.00752).

    One projection gives, per token, the inputs ``x`` and a gate ``z`` (``d_inner`` channels
    each). ``x`` passes a short depthwise causal convolution (``conv_kernel`` taps) and SiLU;
    from it ``x_proj`` gives, per token, a low-rank step (``dt_rank`` values, widened to one per
    channel by ``dt_proj``, with its bias, then softplus) and ``B`` and ``C`` (``state_size``
    each, shared by all channels). Every channel keeps a state of ``state_size`` values that
    decays by ``exp(dt * A)`` (``A = -exp(A_log)``, one rate per channel and state dimension:
    no heads) and takes in ``dt * B * x`` at each token; the output is ``C . state + D x``,
    gated by ``silu(z)`` and projected back. Prefill runs a chunked parallel scan (``chunk``
    tokens at a time), a cached decode steps the recurrence token by token; what a sequence
    keeps is fixed: the convolution's last ``conv_kernel - 1`` inputs and the
    ``d_inner x state_size`` states, whatever the context length.

    Falcon-Mamba (Zuo et al. 2024, arXiv:2410.05355) normalises the low-rank step, ``B`` and
    ``C`` each by an RMSNorm without weight before use: ``bcdt_norm_eps`` (its ``mixer_rms_eps``).
    """

    d_inner: int = Field(gt=0, description="Channels of the scan (Mamba's intermediate_size, expand * d_model).")
    state_size: int = Field(default=16, gt=0, description="State values per channel (Mamba's d_state, N).")
    dt_rank: int | None = Field(default=None, gt=0, description="Rank of the step projection; none: ceil(d_model / 16) (Mamba's 'auto').")
    conv_kernel: ConvTaps = Field(default=4, description="Taps of the short causal convolution over x (at least 2).")
    conv_bias: bool = Field(default=True, description="Bias on the convolution.")
    bias: bool = Field(default=False, description="Biases on the input and output projections.")
    bcdt_norm_eps: float | None = Field(default=None, gt=0, description="Epsilon of the weightless RMSNorms on the step, B and C (Falcon-Mamba's mixer_rms_eps); none: no such norms.")
    bcdt_norm_weights: bool = Field(default=False, description="A learned weight on each of those norms (Jamba's); needs bcdt_norm_eps.")
    chunk: int = Field(default=16, gt=0, description="Tokens per chunk of the parallel scan (speed and memory only).")

    @model_validator(mode="after")
    def _weights_need_norms(self) -> "MambaParams":
        if self.bcdt_norm_weights and self.bcdt_norm_eps is None:
            raise ValueError("bcdt_norm_weights needs bcdt_norm_eps (the norms those weights scale); "
                             "set bcdt_norm_eps or drop bcdt_norm_weights")
        return self

    def sized(self, *, d_model: int) -> Sized:
        D, N, K = self.d_inner, self.state_size, self.conv_kernel
        rank = self.dt_rank if self.dt_rank is not None else default_dt_rank(d_model)
        parameters = ((rank + 2 * N if self.bcdt_norm_weights else 0)  # the norms' weights on dt, B and C
                      + linear(d_model, 2 * D, bias=self.bias)  # x and z at once
                      + D * K + (D if self.conv_bias else 0)  # the depthwise convolution
                      + linear(D, rank + 2 * N, bias=False) + linear(rank, D, bias=True)  # x_proj, dt_proj
                      + D * N + D  # A_log, D
                      + linear(D, d_model, bias=self.bias))
        return Sized(parameters=parameters, keeps_state=True)  # no heads: nothing per token, no positions


__all__ = ["MambaParams", "default_dt_rank"]
