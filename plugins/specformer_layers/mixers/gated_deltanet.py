"""Gated DeltaNet as a block's token mixer (Qwen3-Next, Qwen3.5, OLMo Hybrid)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specformer.model.state import StateSlots

from specformer_layers.mixers.conv import causal_conv, init_conv
from specformer_layers.mixers.delta_rule import delta_rule_recurrent
from specformer_layers.mixers.kernels import GATED_DELTA_RULE, chunked_delta_rule
from specformer_layers.mixers.gated_norm import GatedRMSNorm
from specformer_layers.mixers.gated_deltanet_params import GatedDeltaNetParams
from specformer_layers.mixers.recurrent import MixerRun, RecurrentMixer

#: A cached forward of at most this many tokens runs the rule token by token (decoding); longer ones by chunks.
RECURRENT_MAX_TOKENS = 16
#: Added under the square root when queries and keys are L2-normalised (as flash-linear-attention does).
L2_EPS = 1e-6


class GatedDeltaNet(RecurrentMixer):
    """Gated DeltaNet token mixer: :class:`GatedDeltaNetParams`.

    Module parameters (the names weight mappings rely on), with ``Hk`` key heads of ``dk``
    channels, ``Hv`` value heads of ``dv`` and ``C = 2 Hk dk + Hv dv``:

    - ``qkv``: Linear ``d_model -> C``, no bias, rows ``[q (Hk*dk); k (Hk*dk); v (Hv*dv)]``;
    - ``z``: Linear ``d_model -> Hv*dv``, no bias: the output gate;
    - ``b``: Linear ``d_model -> Hv``, no bias: the write strength beta, before its sigmoid;
    - ``a``: Linear ``d_model -> Hv``, no bias: the decay input;
    - ``conv_weight`` ``(C, K)`` and ``conv_bias`` ``(C,)`` (None without ``conv_bias``): the
      depthwise causal convolution over the ``[q; k; v]`` channels (one convolution over the
      concatenated channels is the separate per-tensor convolutions of some checkpoints);
    - ``A_log`` ``(Hv,)``, ``dt_bias`` ``(Hv,)``: the decay ``g = -exp(A_log) softplus(a x + dt_bias)``;
    - ``norm``: the gated RMSNorm of each head's output, ``norm.weight`` ``(dv,)``;
    - ``out``: Linear ``Hv*dv -> d_model``, no bias.

    Public facts: ``n_heads`` = ``Hv``, ``n_kv_heads`` = ``Hk``, ``head_dim`` = ``dv`` (the
    width of what each head outputs), ``window`` and ``cache_slots`` None (nothing is kept
    per token), ``state_slots`` ``conv`` ``(C, K-1)`` and ``recurrent`` ``(Hv, dk, dv)``,
    ``uses_positions`` False.
    """

    Params = GatedDeltaNetParams

    def __init__(self, params: GatedDeltaNetParams, *, d_model: int, layer_index: int = 0) -> None:
        super().__init__()
        value_heads = params.n_heads
        key_heads, key_dim, value_dim = params.head_sizes(d_model)
        kernel = params.conv_kernel
        # The public facts others read (specformer.model.attention.AttentionLayer, specformer.model.state).
        self.layer_index = layer_index
        self.n_heads = value_heads
        self.n_kv_heads = key_heads
        self.head_dim = value_dim
        self.key_head_dim = key_dim
        self.conv_kernel = kernel
        self.negative_eigenvalues = params.negative_eigenvalues
        self.a_init_range = params.a_init_range
        self.dt_init_range = params.dt_init_range
        self.dt_init_floor = params.dt_init_floor
        self.scan_chunk = params.chunk
        channels = 2 * key_heads * key_dim + value_heads * value_dim
        self.state_slots = StateSlots((("conv", (channels, kernel - 1)), ("recurrent", (value_heads, key_dim, value_dim))))
        # Per token beyond the projections: the convolution, then per head the decay, the key's prediction, the
        # write and the query's read of a dk x dv state (1 + 2 + 2 + 2 multiply-adds per entry).
        self.recurrent_flops_per_token = 2 * channels * kernel + 7 * value_heads * key_dim * value_dim

        self.qkv = nn.Linear(d_model, channels, bias=False)
        self.z = nn.Linear(d_model, value_heads * value_dim, bias=False)
        self.b = nn.Linear(d_model, value_heads, bias=False)
        self.a = nn.Linear(d_model, value_heads, bias=False)
        self.conv_weight = nn.Parameter(torch.empty(channels, kernel))
        self.conv_bias = nn.Parameter(torch.empty(channels)) if params.conv_bias else None
        self.A_log = nn.Parameter(torch.empty(value_heads))
        self.dt_bias = nn.Parameter(torch.empty(value_heads))
        self.norm = GatedRMSNorm(value_dim, eps=params.norm_eps, activation="silu")
        self.out = nn.Linear(value_heads * value_dim, d_model, bias=False)
        init_conv(self.conv_weight, self.conv_bias)
        self._init_decay()

    # -- forward ----------------------------------------------------------------------------

    def run(self, x: Tensor, *, state: dict[str, Tensor] | None = None, padding: Tensor | None = None,
            steps: bool = False) -> MixerRun:
        """The layer on ``x`` ``(B, T, D)`` from ``state`` (zeros when None): output, states after, steps if asked.

        ``padding`` ``(B,)``: tokens opening each row that must leave both states as they were.
        A cached forward of at most :data:`RECURRENT_MAX_TOKENS` tokens (decoding) runs the rule
        token by token, as does one that keeps steps; anything else by chunks.
        """
        recurrent = steps or (state is not None and x.shape[1] <= RECURRENT_MAX_TOKENS)
        window, held = (None, None) if state is None else (state["conv"], state["recurrent"])
        B, T, _ = x.shape
        Hk, Hv, dk, dv = self.n_kv_heads, self.n_heads, self.key_head_dim, self.head_dim
        conv = causal_conv(self.qkv(x), self.conv_weight, self.conv_bias, window=window, padding=padding,
                           activation="silu", steps=steps)
        q, k, v = conv.out.split((Hk * dk, Hk * dk, Hv * dv), dim=-1)
        q = q.reshape(B, T, Hk, dk).transpose(1, 2)  # (B, Hk, T, dk)
        k = k.reshape(B, T, Hk, dk).transpose(1, 2)  # (B, Hk, T, dk)
        v = v.reshape(B, T, Hv, dv).transpose(1, 2)  # (B, Hv, T, dv)
        q, k = _l2_normalised(q), _l2_normalised(k)
        if Hv != Hk:  # value head h reads key head h // (Hv / Hk)
            q = q.repeat_interleave(Hv // Hk, dim=1)  # (B, Hv, T, dk)
            k = k.repeat_interleave(Hv // Hk, dim=1)
        beta = torch.sigmoid(self.b(x))  # (B, T, Hv)
        if self.negative_eigenvalues:
            beta = beta * 2
        # In float32 at least, whatever the weights' dtype: exp(A_log) of a half-precision A_log may overflow.
        wide = torch.promote_types(x.dtype, torch.float32)
        log_decay = -self.A_log.to(wide).exp() * F.softplus(self.a(x).to(wide) + self.dt_bias.to(wide))  # (B, T, Hv)
        if padding is not None:  # padding writes nothing and decays nothing: the state stays as it was
            is_padding = (torch.arange(T, device=x.device)[None, :] < padding[:, None])[..., None]  # (B, T, 1)
            beta = beta.masked_fill(is_padding, 0.0)
            log_decay = log_decay.masked_fill(is_padding, 0.0)
        beta, log_decay = beta.transpose(1, 2), log_decay.transpose(1, 2)  # (B, Hv, T)
        if recurrent:
            rule = delta_rule_recurrent(q, k, v, beta, log_decay, state=held, scale=dk ** -0.5, steps=steps)
        else:
            rule = chunked_delta_rule(q, k, v, beta, log_decay, state=held, scale=dk ** -0.5, chunk=self.scan_chunk)
        o = rule.out.transpose(1, 2)  # (B, T, Hv, dv)
        gate = self.z(x).reshape(B, T, Hv, dv)
        y = self.norm(o, gate).reshape(B, T, Hv * dv)
        return MixerRun(out=self.out(y), state={"conv": conv.window, "recurrent": rule.state},
                        steps={"conv": conv.steps, "recurrent": rule.steps} if steps else None)

    # -- facts and initialisation ---------------------------------------------------------------

    def describe_kernel(self, *, bias: bool = False) -> str:
        """The kernel this layer runs, in words (``specformer summary``); ``bias`` (a scheme biasing scores) changes nothing here."""
        return GATED_DELTA_RULE.describe(f"torch chunked (chunk {self.scan_chunk})") + \
            f"; token by token for cached forwards of <= {RECURRENT_MAX_TOKENS} tokens"

    def extra_repr(self) -> str:
        parts = [f"n_heads={self.n_heads}", f"n_key_heads={self.n_kv_heads}", f"key_head_dim={self.key_head_dim}",
                 f"value_head_dim={self.head_dim}", f"conv_kernel={self.conv_kernel}", f"chunk={self.scan_chunk}"]
        if self.negative_eigenvalues:
            parts.append("negative_eigenvalues=True")
        return ", ".join(parts)

    def init_weights(self, *, std: float, residual_std: float) -> None:
        for linear in (self.qkv, self.z, self.b, self.a):
            nn.init.normal_(linear.weight, std=std)
        nn.init.normal_(self.out.weight, std=residual_std)  # feeds the residual stream
        init_conv(self.conv_weight, self.conv_bias)
        self._init_decay()

    @torch.no_grad()
    def _init_decay(self) -> None:
        low, high = self.a_init_range
        self.A_log.copy_(torch.empty_like(self.A_log).uniform_(low, high).log())
        if self.dt_init_range is None:
            self.dt_bias.fill_(1.0)
            return
        dt_min, dt_max = self.dt_init_range
        dt = torch.exp(torch.rand_like(self.dt_bias) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        dt = dt.clamp(min=self.dt_init_floor)
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus(dt_bias) = dt


def _l2_normalised(x: Tensor) -> Tensor:
    """``x / sqrt(|x|^2 + eps)`` over the last dimension, in float32 or wider (flash-linear-attention's form)."""
    x = x.to(torch.promote_types(x.dtype, torch.float32))
    return x * torch.rsqrt(x.square().sum(dim=-1, keepdim=True) + L2_EPS)


__all__ = ["GatedDeltaNet"]
