"""Mamba-2: a selective state-space token mixer in a block's mixer slot (:class:`Mamba2Params`)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specformer.model.state import StateSlots

from specformer_layers.mixers.conv import causal_conv, init_conv
from specformer_layers.mixers.grouped_gated_norm import GroupedGatedRMSNorm
from specformer_layers.mixers.mamba2_params import Mamba2Params
from specformer_layers.mixers.kernels import SSD, chunked_ssd
from specformer_layers.mixers.recurrent import MixerRun, RecurrentMixer
from specformer_layers.mixers.ssd import ssd_recurrent, working_dtype

#: Steps at most this many tokens token by token in a cached forward (decode); longer ones go by chunks.
RECURRENT_UP_TO = 1
#: Mamba-2's initial steps, log-uniform in this range, and decay rates A, uniform in this one.
DT_INIT = (1e-3, 1e-1)
A_INIT = (1.0, 16.0)


class Mamba2(RecurrentMixer):
    """Mamba-2's mixer (:class:`Mamba2Params`), written for the model's mixer slot.

    Parameters, by name (weight conversions rely on them): ``in_proj`` (Linear
    ``d_model -> 2 * d_inner + 2 * G * N + H``, rows in the order ``[z, x, B, C, dt]``),
    ``conv_weight`` ``(C, K)`` and ``conv_bias`` ``(C,)`` (or None) of the depthwise causal
    convolution over the ``C = d_inner + 2 * G * N`` channels ``[x, B, C]``, ``dt_bias``,
    ``A_log`` and ``D`` ``(H,)``, ``norm`` (:class:`GroupedGatedRMSNorm`, ``.weight``
    ``(d_inner,)``) and ``out`` (Linear ``d_inner -> d_model``), with ``H`` heads of ``P``
    channels (``d_inner = H * P``), ``G`` groups of state size ``N`` and ``K`` taps.

    Per sequence it keeps ``conv`` ``(C, K - 1)`` (the last inputs of the convolution) and
    ``ssm`` ``(H, P, N)`` (the states): its :attr:`state_slots`.
    """

    Params = Mamba2Params

    def __init__(self, params: Mamba2Params, *, d_model: int, layer_index: int = 0) -> None:
        super().__init__()
        heads, head_dim, size, groups = params.n_heads, params.head_dim, params.state_size, params.n_groups
        self.d_inner = heads * head_dim
        self.state_size = size
        self.n_groups = groups
        self.conv_channels = self.d_inner + 2 * groups * size
        # The public facts (specformer.model.attention.AttentionLayer and specformer.model.state) others read.
        self.layer_index = layer_index
        self.n_heads = heads
        self.head_dim = head_dim
        # Per token and head: decay and write the (P, N) state, then read it out with C (specformer summary).
        self.recurrent_flops_per_token = 5 * heads * head_dim * size
        self.state_slots = StateSlots((("conv", (self.conv_channels, params.conv_kernel - 1)),
                                       ("ssm", (heads, head_dim, size))))
        self.dt_min = params.dt_min
        self.dt_max = params.dt_max
        self.scan_chunk = params.chunk

        self.in_proj = nn.Linear(d_model, self.d_inner + self.conv_channels + heads, bias=params.bias)
        self.conv_weight = nn.Parameter(torch.empty(self.conv_channels, params.conv_kernel))
        self.conv_bias = nn.Parameter(torch.zeros(self.conv_channels)) if params.conv_bias else None
        self.dt_bias = nn.Parameter(torch.empty(heads))
        self.A_log = nn.Parameter(torch.empty(heads))
        self.D = nn.Parameter(torch.empty(heads))
        # Falcon-H1 without mamba_rms_norm: the output is only gated, and there is no norm weight.
        self.norm = (GroupedGatedRMSNorm(self.d_inner, groups=groups, eps=params.norm_eps,
                                         norm_before_gate=params.norm_before_gate) if params.gated_norm else None)
        multipliers = params.projection_multipliers
        self.projection_multipliers = None if multipliers is None else tuple(multipliers)
        self.out = nn.Linear(self.d_inner, d_model, bias=params.bias)
        init_conv(self.conv_weight, self.conv_bias)
        self._init_scan()

    # -- forward -----------------------------------------------------------------------------------

    def run(self, x: Tensor, *, state: dict[str, Tensor] | None = None, padding: Tensor | None = None,
            steps: bool = False) -> MixerRun:
        """The layer on ``x`` ``(B, T, D)`` from ``state`` (None: fresh rows); output, state after, steps if asked."""
        batch, length, _ = x.shape
        heads, head_dim, size, groups = self.n_heads, self.head_dim, self.state_size, self.n_groups
        projected = self.in_proj(x)  # (B, T, d_inner + C + H): [z, x, B, C, dt]
        if self.projection_multipliers is not None:
            projected = projected * self._projection_scale(projected)
        z, xbc, dt = projected.split((self.d_inner, self.conv_channels, heads), dim=-1)
        conv = causal_conv(xbc, self.conv_weight, self.conv_bias, window=None if state is None else state["conv"],
                           padding=padding, activation="silu", steps=steps)
        xs, B, C = conv.out.split((self.d_inner, groups * size, groups * size), dim=-1)
        work = working_dtype(x.dtype)
        dt = F.softplus(dt.to(work) + self.dt_bias.to(work))  # (B, T, H)
        dt = dt.clamp(min=self.dt_min, max=self.dt_max)
        if padding is not None:
            # A padding token steps by 0: it neither decays nor writes the state.
            is_padding = torch.arange(length, device=x.device)[None, :] < padding[:, None]  # (B, T)
            dt = dt.masked_fill(is_padding[..., None], 0.0)
        A = -torch.exp(self.A_log.to(work))
        xs = xs.reshape(batch, length, heads, head_dim)  # (B, T, H, P)
        B = B.reshape(batch, length, groups, size)  # (B, T, G, N)
        C = C.reshape(batch, length, groups, size)
        ssm = None if state is None else state["ssm"]
        kept = None
        if steps or (state is not None and length <= RECURRENT_UP_TO):
            y, ssm, kept = ssd_recurrent(xs, dt, A, B, C, D=self.D, state=ssm, steps=steps)
        else:
            y, ssm = chunked_ssd(xs, dt, A, B, C, chunk=self.scan_chunk, D=self.D, state=ssm)
        y = y.reshape(batch, length, self.d_inner)
        y = self.norm(y, z) if self.norm is not None else y * F.silu(z.to(y.dtype))
        out = self.out(y.to(x.dtype))
        return MixerRun(out=out, state={"conv": conv.window, "ssm": ssm},
                        steps={"conv": conv.steps, "ssm": kept} if steps else None)

    def _projection_scale(self, projected: Tensor) -> Tensor:
        """``(d_inner + C + H,)``: each part's factor repeated over its channels (z, x, B, C, dt)."""
        assert self.projection_multipliers is not None
        widths = (self.d_inner, self.d_inner, self.n_groups * self.state_size, self.n_groups * self.state_size,
                  self.n_heads)
        return torch.cat([projected.new_full((w,), m) for w, m in zip(widths, self.projection_multipliers)])

    # -- description and initialisation -----------------------------------------------------------

    def describe_kernel(self, *, bias: bool = False) -> str:
        """What runs, in words (``specformer summary``)."""
        return SSD.describe(f"torch ssd chunked (chunk {self.scan_chunk})") + "; token by token when decoding"

    def extra_repr(self) -> str:
        parts = [f"n_heads={self.n_heads}", f"head_dim={self.head_dim}", f"state_size={self.state_size}",
                 f"n_groups={self.n_groups}", f"conv_kernel={self.conv_weight.shape[1]}", f"chunk={self.scan_chunk}"]
        if self.dt_min or self.dt_max is not None:
            parts.append(f"dt=[{self.dt_min}, {self.dt_max if self.dt_max is not None else 'inf'}]")
        return ", ".join(parts)

    def init_weights(self, *, std: float, residual_std: float) -> None:
        nn.init.normal_(self.in_proj.weight, std=std)
        nn.init.normal_(self.out.weight, std=residual_std)  # feeds the residual stream
        for bias in (self.in_proj.bias, self.out.bias):
            if bias is not None:
                nn.init.zeros_(bias)
        if self.norm is not None:
            nn.init.ones_(self.norm.weight)
        init_conv(self.conv_weight, self.conv_bias)
        self._init_scan()

    @torch.no_grad()
    def _init_scan(self) -> None:
        # Steps log-uniform in DT_INIT, stored as softplus's inverse so softplus(dt_bias) is the step;
        # decay rates uniform in A_INIT; the skip at 1 (Mamba-2's initialisation).
        low, high = (math.log(v) for v in DT_INIT)
        dt = torch.exp(torch.rand(self.n_heads) * (high - low) + low)
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))
        self.A_log.copy_(torch.log(torch.empty(self.n_heads).uniform_(*A_INIT)))
        self.D.fill_(1.0)


__all__ = ["Mamba2"]
