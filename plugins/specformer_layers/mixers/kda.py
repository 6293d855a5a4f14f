"""Kimi Delta Attention (KDA, Kimi Linear): a gated delta rule with per-channel forgetting."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specformer.model.state import StateSlots
from specformer_layers.mixers.conv import causal_conv
from specformer_layers.mixers.delta_rule import delta_rule_recurrent
from specformer_layers.mixers.kernels import KIMI_DELTA_RULE, chunked_delta_rule
from specformer_layers.mixers.gated_norm import GatedRMSNorm
from specformer_layers.mixers.kda_params import KimiDeltaAttentionParams
from specformer_layers.mixers.recurrent import MixerRun, RecurrentMixer

#: Up to this many tokens a cached forward runs token by token (decoding, speculative drafts); longer ones chunked.
RECURRENT_UP_TO = 16
#: Added to the squared norm before the square root when queries and keys are L2-normalised (as FLA's kernels do).
L2_EPS = 1e-6


class KimiDeltaAttention(RecurrentMixer):
    """Kimi Delta Attention: :class:`KimiDeltaAttentionParams`.

    Parameters: ``qkv`` (one Linear ``d_model -> 2*H*dk + H*dv``, rows ``[q; k; v]``, as the
    attention's ``qkv``; the short convolution runs over the same concatenated channels,
    ``conv_weight`` ``(C, K)`` with ``C = 2*H*dk + H*dv`` and ``conv_bias`` ``(C,)`` or None,
    since a depthwise convolution over concatenated channels is the separate convolutions side
    by side); the decay ``f_a`` ``(rank, d_model)``, ``f_b`` ``(H*dk, rank)`` (with ``decay_rank:
    full`` one ``f`` ``(H*dk, d_model)``), ``A_log`` ``(H,)``, ``dt_bias`` ``(H*dk,)``; the write
    strength ``b`` ``(H, d_model)``; the output gate ``g_a``, ``g_b`` (with ``gate_rank: full``
    one ``g`` ``(H*dv, d_model)``); the gated output norm ``norm`` (``.weight`` ``(dv,)``) and ``out``
    ``(d_model, H*dv)``. The state per sequence: ``conv`` ``(C, K-1)`` and ``recurrent``
    ``(H, dk, dv)``, kept in the model's dtype by the cache.
    """

    Params = KimiDeltaAttentionParams

    def __init__(self, params: KimiDeltaAttentionParams, *, d_model: int, layer_index: int = 0) -> None:
        super().__init__()
        n_heads = params.n_heads
        head_dim, value_dim = params.head_dims(d_model)
        # The public facts (specformer.model.attention.AttentionLayer, specformer.model.state).
        self.layer_index = layer_index
        self.n_heads = n_heads
        self.head_dim = head_dim
        self.value_head_dim = value_dim
        self.conv_kernel = params.conv_kernel
        self.scan_chunk = params.chunk
        self.decay_bound = params.decay_bound
        channels = 2 * n_heads * head_dim + n_heads * value_dim
        self.state_slots = StateSlots((("conv", (channels, params.conv_kernel - 1)),
                                       ("recurrent", (n_heads, head_dim, value_dim))))
        # Per token beyond the projections: the convolution, then per head the per-channel decay, the key's
        # prediction, the write and the query's read of a dk x dv state (1 + 2 + 2 + 2 multiply-adds per entry).
        self.recurrent_flops_per_token = 2 * channels * params.conv_kernel + 7 * n_heads * head_dim * value_dim

        self.qkv = nn.Linear(d_model, channels, bias=False)
        self.conv_weight = nn.Parameter(torch.empty(channels, params.conv_kernel))
        self.conv_bias = nn.Parameter(torch.zeros(channels)) if params.conv_bias else None
        decay_rank, gate_rank = params.decay_rank or head_dim, params.gate_rank or value_dim
        # A full projection is one Linear (f, g); a low-rank one two through the bottleneck (f_a then f_b; g_a, g_b).
        if decay_rank == "full":
            self.f = nn.Linear(d_model, n_heads * head_dim, bias=False)
        else:
            self.f_a = nn.Linear(d_model, decay_rank, bias=False)
            self.f_b = nn.Linear(decay_rank, n_heads * head_dim, bias=False)
        self.A_log = nn.Parameter(torch.empty(n_heads))
        self.dt_bias = nn.Parameter(torch.empty(n_heads * head_dim))
        self.b = nn.Linear(d_model, n_heads, bias=False)
        if gate_rank == "full":
            self.g = nn.Linear(d_model, n_heads * value_dim, bias=False)
        else:
            self.g_a = nn.Linear(d_model, gate_rank, bias=False)
            self.g_b = nn.Linear(gate_rank, n_heads * value_dim, bias=False)
        self.norm = GatedRMSNorm(value_dim, eps=params.norm_eps, activation="sigmoid")
        self.out = nn.Linear(n_heads * value_dim, d_model, bias=False)
        self._init_decay()
        nn.init.kaiming_uniform_(self.conv_weight, a=math.sqrt(5))  # what nn.Conv1d starts from

    def run(self, x: Tensor, *, state: dict[str, Tensor] | None = None, padding: Tensor | None = None,
            steps: bool = False) -> MixerRun:
        """The layer on ``x`` ``(B, T, D)`` from ``state`` (zeros when None): output, states after, steps if asked."""
        conv, recurrent = (None, None) if state is None else (state["conv"], state["recurrent"])
        B, T, _ = x.shape
        H, dk, dv = self.n_heads, self.head_dim, self.value_head_dim
        mixed = causal_conv(self.qkv(x), self.conv_weight, self.conv_bias, window=conv, padding=padding,
                            activation="silu", steps=steps)
        q, k, v = mixed.out.split((H * dk, H * dk, H * dv), dim=-1)
        # Gates and normalisation in fp32 at least, as the delta rule computes (its state accumulates over the context).
        work = torch.promote_types(x.dtype, torch.float32)
        q = _l2_normalise(q.view(B, T, H, dk).transpose(1, 2).to(work))  # (B, H, T, dk); the rule scales it by dk^-1/2
        k = _l2_normalise(k.view(B, T, H, dk).transpose(1, 2).to(work))  # (B, H, T, dk)
        v = v.view(B, T, H, dv).transpose(1, 2).to(work)  # (B, H, T, dv)
        log_decay = self._log_decay(x, work).view(B, T, H, dk).transpose(1, 2)  # (B, H, T, dk)
        beta = torch.sigmoid(self.b(x).to(work)).transpose(1, 2)  # (B, H, T)
        if padding is not None:
            # A padding token neither forgets (decay 1) nor writes (strength 0): the state passes it unchanged.
            is_padding = (torch.arange(T, device=x.device)[None, :] < padding[:, None])[:, None, :]  # (B, 1, T)
            beta = beta.masked_fill(is_padding, 0.0)
            log_decay = log_decay.masked_fill(is_padding[..., None], 0.0)
        initial = None if recurrent is None else recurrent.to(work)
        if steps or (initial is not None and T <= RECURRENT_UP_TO):
            rule = delta_rule_recurrent(q, k, v, beta, log_decay, state=initial, steps=steps)
        else:
            rule = chunked_delta_rule(q, k, v, beta, log_decay, state=initial, chunk=self.scan_chunk)
        kept = None
        if steps:
            assert rule.steps is not None and mixed.steps is not None
            kept = {"conv": mixed.steps, "recurrent": rule.steps.to(x.dtype)}
        gate = self._projected(x, "g").view(B, T, H, dv)
        y = self.norm(rule.out.transpose(1, 2).to(x.dtype), gate).reshape(B, T, H * dv)  # (B, T, H*dv)
        return MixerRun(out=self.out(y), state={"conv": mixed.window, "recurrent": rule.state.to(x.dtype)}, steps=kept)

    def _log_decay(self, x: Tensor, dtype: torch.dtype) -> Tensor:
        """``(B, T, H*dk)``: the log of each key channel's decay (<= 0).

        ``-exp(A_log) * softplus(f(x) + dt_bias)``, or with ``decay_bound`` (Ling 3's safe gate)
        ``decay_bound * sigmoid(exp(A_log) * (f(x) + dt_bias))``, which no input can push below the bound.
        """
        raw = self._projected(x, "f").to(dtype) + self.dt_bias.to(dtype)
        rate = torch.exp(self.A_log.to(dtype)).repeat_interleave(self.head_dim)  # (H*dk,) each head's rate on its channels
        if self.decay_bound is not None:
            return self.decay_bound * torch.sigmoid(rate * raw)
        return -rate * F.softplus(raw)

    def _projections(self, name: str) -> tuple[nn.Linear, ...]:
        """The decay's (``f``) or the output gate's (``g``) Linears: the full one, or the low-rank pair in order."""
        full = getattr(self, name, None)
        return (full,) if full is not None else (getattr(self, f"{name}_a"), getattr(self, f"{name}_b"))

    def _projected(self, x: Tensor, name: str) -> Tensor:
        for linear in self._projections(name):
            x = linear(x)
        return x

    def _init_decay(self) -> None:
        """As FLA starts KDA: A uniform in [1, 16]; dt_bias the inverse softplus of dt, log-uniform in [1e-3, 1e-1]."""
        with torch.no_grad():
            self.A_log.copy_(torch.empty_like(self.A_log).uniform_(1.0, 16.0).log())
            dt = torch.empty_like(self.dt_bias).uniform_(math.log(1e-3), math.log(1e-1)).exp().clamp_min(1e-4)
            self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))

    def init_weights(self, *, std: float, residual_std: float) -> None:
        for linear in (self.qkv, self.b, *self._projections("f"), *self._projections("g")):
            nn.init.normal_(linear.weight, std=std)
        nn.init.normal_(self.out.weight, std=residual_std)  # feeds the residual stream
        nn.init.kaiming_uniform_(self.conv_weight, a=math.sqrt(5))
        if self.conv_bias is not None:
            nn.init.zeros_(self.conv_bias)
        nn.init.ones_(self.norm.weight)
        self._init_decay()

    def describe_kernel(self, *, bias: bool = False) -> str:
        """The kernel this layer runs, in words (``specformer summary``); no positional bias reaches a recurrence."""
        return KIMI_DELTA_RULE.describe(f"torch chunked (chunk {self.scan_chunk})") + "; token by token when decoding"

    def extra_repr(self) -> str:
        return (f"n_heads={self.n_heads}, head_dim={self.head_dim}, value_head_dim={self.value_head_dim}, "
                f"conv_kernel={self.conv_kernel}, chunk={self.scan_chunk}"
                + ("" if self.decay_bound is None else f", decay_bound={self.decay_bound}"))


def _l2_normalise(x: Tensor) -> Tensor:
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + L2_EPS)


__all__ = ["KimiDeltaAttention"]
