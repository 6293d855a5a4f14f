"""The settings of Mamba-2's mixer, importable without torch (listing components reads only these)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from specformer.registry.params import Params, Sized
from specformer.model.sized import linear
from specformer_layers.mixers.conv_params import ConvTaps


class Mamba2Params(Params):
    """Mamba-2's selective state-space mixer (Dao & Gu 2024, "Transformers are SSMs", arXiv:2405.21060).

    One projection gives, per token, a gate ``z``, the inputs ``x`` (``n_heads`` heads of
    ``head_dim`` channels), ``B`` and ``C`` (``n_groups`` groups of ``state_size``, each shared
    by ``n_heads / n_groups`` heads) and a step ``dt`` per head. ``x``, ``B`` and ``C`` pass a
    short causal convolution (``conv_kernel`` taps) and SiLU; ``dt`` is
    ``softplus(dt + dt_bias)`` clamped to ``[dt_min, dt_max]``. Each head keeps a state of
    ``head_dim x state_size`` that decays by ``exp(dt * A)`` (``A = -exp(A_log)``) and takes in
    ``dt * x B^T`` at each token; the output is ``state C + D x``, normalised by an RMSNorm per
    group and gated by ``silu(z)`` (after the norm with ``norm_before_gate``, before it
    otherwise, as Mamba-2 does), then projected back. The inner width is
    ``n_heads * head_dim`` (Mamba-2's ``expand * d_model``). Training and prefill run the
    chunked (state-space-dual) form, ``chunk`` tokens at a time; a cached decode steps the
    recurrence token by token. What a sequence keeps is fixed: the convolution's last
    ``conv_kernel - 1`` inputs and the states, whatever the context length.

    Falcon-H1 (Zuo et al. 2025, arXiv:2507.22448) adds two variations: ``gated_norm: false``
    gates the output by ``silu(z)`` with no norm (its ``mamba_rms_norm: false``), and
    ``projection_multipliers`` scales the five parts of the input projection ``[z, x, B, C,
    dt]`` each by its own factor before they are used (its muP ``ssm_multipliers``).
    """

    n_heads: int = Field(gt=0, description="Heads of the scan (Mamba-2's num_heads).")
    head_dim: int = Field(gt=0, description="Channels per head; the inner width is n_heads * head_dim.")
    state_size: int = Field(default=128, gt=0, description="State channels per head (Mamba-2's d_state, N).")
    n_groups: int = Field(default=1, gt=0, description="Groups of B and C, each shared by n_heads / n_groups heads; the gated norm is per group too.")
    conv_kernel: ConvTaps = Field(default=4, description="Taps of the short causal convolution over x, B and C (at least 2).")
    conv_bias: bool = Field(default=True, description="Bias on the convolution.")
    bias: bool = Field(default=False, description="Biases on the input and output projections.")
    dt_min: float = Field(default=0.0, ge=0, description="Lower clamp of the step after softplus (Mamba-2's time_step_limit[0]).")
    dt_max: float | None = Field(default=None, gt=0, description="Upper clamp of the step after softplus; none: no limit.")
    norm_eps: float = Field(default=1e-5, gt=0, description="Epsilon of the gated RMSNorm.")
    norm_before_gate: bool = Field(default=False, description="Normalise, then gate (else gate, then normalise: Mamba-2).")
    chunk: int = Field(default=256, gt=0, description="Tokens per chunk of the chunked scan (speed and memory only).")
    gated_norm: bool = Field(default=True, description="The gated RMSNorm on the output; false: only the gate silu(z), no norm (Falcon-H1).")
    projection_multipliers: list[float] | None = Field(
        default=None, description="Five factors for the input projection's parts [z, x, B, C, dt] (Falcon-H1's ssm_multipliers); none: 1.",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_scaling_is_none(cls, data: Any) -> Any:
        # One spelling for "no scaling": five 1s are the same projection as none at all.
        if isinstance(data, dict) and data.get("projection_multipliers") == [1.0] * 5:
            data = {**data, "projection_multipliers": None}
        return data

    @model_validator(mode="after")
    def _sizes_fit(self) -> "Mamba2Params":
        if self.n_heads % self.n_groups:
            raise ValueError(f"n_groups ({self.n_groups}) must divide n_heads ({self.n_heads}): "
                             f"each group of B, C and the norm serves whole heads")
        if self.projection_multipliers is not None and len(self.projection_multipliers) != 5:
            raise ValueError(f"projection_multipliers needs one factor for each of z, x, B, C and dt, got "
                             f"{len(self.projection_multipliers)}")
        if self.dt_max is not None and self.dt_max <= self.dt_min:
            raise ValueError(f"dt_max ({self.dt_max}) must be above dt_min ({self.dt_min})")
        return self

    def sized(self, *, d_model: int) -> Sized:
        H, hd, N, G, K = self.n_heads, self.head_dim, self.state_size, self.n_groups, self.conv_kernel
        d_inner = H * hd
        conv_channels = d_inner + 2 * G * N  # x, B and C
        if self.gated_norm and d_inner % G:
            raise ValueError(f"the gated norm's {d_inner} channels do not split into {G} groups")
        parameters = (linear(d_model, d_inner + conv_channels + H, bias=self.bias)  # z, x, B, C and dt at once
                      + conv_channels * K + (conv_channels if self.conv_bias else 0) + 3 * H  # conv, dt_bias, A_log, D
                      + (d_inner if self.gated_norm else 0) + linear(d_inner, d_model, bias=self.bias))
        return Sized(parameters=parameters, n_heads=H, head_dim=hd, keeps_state=True)


__all__ = ["Mamba2Params"]
