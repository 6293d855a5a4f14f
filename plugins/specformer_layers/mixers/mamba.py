"""Mamba-1: a selective state-space token mixer in a block's mixer slot (:class:`MambaParams`)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specformer.model.state import StateSlots

from specformer_layers.mixers.conv import causal_conv, init_conv
from specformer_layers.mixers.mamba_params import MambaParams, default_dt_rank
from specformer_layers.mixers.recurrent import MixerRun, RecurrentMixer
from specformer_layers.mixers.selective_scan import selective_scan_chunked, selective_scan_recurrent
from specformer_layers.mixers.ssd import working_dtype

#: Steps at most this many tokens token by token in a cached forward (decode); longer ones go by chunks.
RECURRENT_UP_TO = 1
#: Mamba's initial steps, log-uniform in this range (its dt_min, dt_max), floored at DT_FLOOR.
DT_INIT = (1e-3, 1e-1)
DT_FLOOR = 1e-4


class Mamba(RecurrentMixer):
    """Mamba-1's mixer (:class:`MambaParams`), written for the model's mixer slot.

    Parameters, by name (weight conversions rely on them): ``in_proj`` (Linear
    ``d_model -> 2 * d_inner``, rows ``[x, z]``), ``conv_weight`` ``(d_inner, K)`` and
    ``conv_bias`` ``(d_inner,)`` (or None) of the depthwise causal convolution over ``x``,
    ``x_proj`` (Linear ``d_inner -> R + 2 * N``, no bias, rows ``[dt, B, C]``), ``dt_proj``
    (Linear ``R -> d_inner`` with bias), ``A_log`` ``(d_inner, N)``, ``D`` ``(d_inner,)``,
    ``out`` (Linear ``d_inner -> d_model``) and, with ``bcdt_norm_weights``, the norms' weights
    ``dt_norm_weight`` ``(R,)``, ``b_norm_weight`` and ``c_norm_weight`` ``(N,)``, with ``R`` the step's rank, ``N`` the state size and
    ``K`` taps.

    It has no heads (every channel has its own decay rates), keeps nothing per token and
    reads no positions. Per sequence it keeps ``conv`` ``(d_inner, K - 1)`` (the last inputs of the
    convolution) and ``ssm`` ``(d_inner, N)`` (the states): its :attr:`state_slots`.
    """

    Params = MambaParams

    def __init__(self, params: MambaParams, *, d_model: int, layer_index: int = 0) -> None:
        super().__init__()
        inner, size = params.d_inner, params.state_size
        self.d_inner = inner
        self.state_size = size
        self.dt_rank = params.dt_rank if params.dt_rank is not None else default_dt_rank(d_model)
        self.bcdt_norm_eps = params.bcdt_norm_eps
        self.scan_chunk = params.chunk
        # The public facts others read (specformer.model.state): its layer and its state.
        self.layer_index = layer_index
        # Per token, channel and state value: the decay's exp and product, the write's two products, the read.
        self.recurrent_flops_per_token = 6 * inner * size
        self.state_slots = StateSlots((("conv", (inner, params.conv_kernel - 1)), ("ssm", (inner, size))))

        self.in_proj = nn.Linear(d_model, 2 * inner, bias=params.bias)
        self.conv_weight = nn.Parameter(torch.empty(inner, params.conv_kernel))
        self.conv_bias = nn.Parameter(torch.zeros(inner)) if params.conv_bias else None
        self.x_proj = nn.Linear(inner, self.dt_rank + 2 * size, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, inner, bias=True)
        self.A_log = nn.Parameter(torch.empty(inner, size))
        self.D = nn.Parameter(torch.empty(inner))
        self.out = nn.Linear(inner, d_model, bias=params.bias)
        # Jamba's norms on dt, B and C carry a weight each (Falcon-Mamba's do not): None without them.
        self.dt_norm_weight = nn.Parameter(torch.ones(self.dt_rank)) if params.bcdt_norm_weights else None
        self.b_norm_weight = nn.Parameter(torch.ones(size)) if params.bcdt_norm_weights else None
        self.c_norm_weight = nn.Parameter(torch.ones(size)) if params.bcdt_norm_weights else None
        init_conv(self.conv_weight, self.conv_bias)
        self._init_scan()

    # -- forward -----------------------------------------------------------------------------------

    def run(self, x: Tensor, *, state: dict[str, Tensor] | None = None, padding: Tensor | None = None,
            steps: bool = False) -> MixerRun:
        """The layer on ``x`` ``(B, T, D)`` from ``state`` (None: fresh rows); output, state after, steps if asked."""
        length = x.shape[1]
        xs, z = self.in_proj(x).chunk(2, dim=-1)  # (B, T, d_inner) each
        conv = causal_conv(xs, self.conv_weight, self.conv_bias, window=None if state is None else state["conv"],
                           padding=padding, activation="silu", steps=steps)
        u = conv.out  # (B, T, d_inner)
        dt, B, C = self.x_proj(u).split((self.dt_rank, self.state_size, self.state_size), dim=-1)
        if self.bcdt_norm_eps is not None:
            dt, B, C = (self._rms(t, w) for t, w in ((dt, self.dt_norm_weight), (B, self.b_norm_weight),
                                                     (C, self.c_norm_weight)))
        work = working_dtype(x.dtype)
        # The bias joins in the working dtype, before softplus (as Mamba's kernels add delta_bias).
        dt = F.softplus(F.linear(dt, self.dt_proj.weight).to(work) + self.dt_proj.bias.to(work))  # (B, T, d_inner)
        if padding is not None:
            # A padding token steps by 0: it neither decays nor writes the state.
            is_padding = torch.arange(length, device=x.device)[None, :] < padding[:, None]  # (B, T)
            dt = dt.masked_fill(is_padding[..., None], 0.0)
        A = -torch.exp(self.A_log.to(work))
        ssm = None if state is None else state["ssm"]
        kept = None
        if steps or (state is not None and length <= RECURRENT_UP_TO):
            y, ssm, kept = selective_scan_recurrent(u, dt, A, B, C, D=self.D, state=ssm, steps=steps)
        else:
            y, ssm = selective_scan_chunked(u, dt, A, B, C, chunk=self.scan_chunk, D=self.D, state=ssm)
        y = y * F.silu(z.to(y.dtype))
        out = self.out(y.to(x.dtype))
        return MixerRun(out=out, state={"conv": conv.window, "ssm": ssm},
                        steps={"conv": conv.steps, "ssm": kept} if steps else None)

    def _rms(self, t: Tensor, weight: Tensor | None) -> Tensor:
        """RMSNorm over the last dim in float32 at least, back in ``t``'s dtype, then times ``weight`` if any.

        Falcon-Mamba's has no weight; Jamba's (JambaRMSNorm) scales after casting back, as here.
        """
        assert self.bcdt_norm_eps is not None
        w = t.to(working_dtype(t.dtype))
        normed = (w * torch.rsqrt(w.pow(2).mean(-1, keepdim=True) + self.bcdt_norm_eps)).to(t.dtype)
        return normed if weight is None else weight * normed

    # -- description and initialisation -----------------------------------------------------------

    def describe_kernel(self, *, bias: bool = False) -> str:
        """What runs, in words (``specformer summary``)."""
        return f"torch selective scan, parallel by chunks (chunk {self.scan_chunk}); token by token when decoding"

    def extra_repr(self) -> str:
        parts = [f"d_inner={self.d_inner}", f"state_size={self.state_size}", f"dt_rank={self.dt_rank}",
                 f"conv_kernel={self.conv_weight.shape[1]}", f"chunk={self.scan_chunk}"]
        if self.bcdt_norm_eps is not None:
            parts.append(f"bcdt_norm_eps={self.bcdt_norm_eps}")
        if self.dt_norm_weight is not None:
            parts.append("bcdt_norm_weights=True")
        return ", ".join(parts)

    def init_weights(self, *, std: float, residual_std: float) -> None:
        nn.init.normal_(self.in_proj.weight, std=std)
        nn.init.normal_(self.x_proj.weight, std=std)
        nn.init.normal_(self.out.weight, std=residual_std)  # feeds the residual stream
        for bias in (self.in_proj.bias, self.out.bias):
            if bias is not None:
                nn.init.zeros_(bias)
        for weight in (self.dt_norm_weight, self.b_norm_weight, self.c_norm_weight):
            if weight is not None:
                nn.init.ones_(weight)
        init_conv(self.conv_weight, self.conv_bias)
        self._init_scan()

    @torch.no_grad()
    def _init_scan(self) -> None:
        # Mamba's initialisation: dt_proj's weight uniform within rank^-1/2, its bias softplus's inverse of steps
        # log-uniform in DT_INIT (floored), A = 1..N in every channel (S4D-real), the skip at 1.
        bound = self.dt_rank ** -0.5
        nn.init.uniform_(self.dt_proj.weight, -bound, bound)
        low, high = (math.log(v) for v in DT_INIT)
        dt = torch.exp(torch.rand(self.d_inner) * (high - low) + low).clamp(min=DT_FLOOR)
        self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))
        self.A_log.copy_(torch.log(torch.arange(1, self.state_size + 1, dtype=torch.float32)).expand(self.d_inner, -1))
        self.D.fill_(1.0)


__all__ = ["Mamba"]
