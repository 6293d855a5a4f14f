"""The mLSTM token mixer (xLSTM's matrix memory): :class:`MLSTMParams`."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specformer.model.state import StateSlots

from specformer_layers.mixers.mlstm_params import MLSTMParams
from specformer_layers.mixers.recurrent import MixerRun, RecurrentMixer
from specformer_layers.mixers.ssd import working_dtype

#: A cached forward of at most this many tokens runs token by token (decoding); longer ones by chunks.
RECURRENT_MAX_TOKENS = 16


@dataclass(frozen=True)
class MemoryState:
    """The stabilised memory ``C`` ``(B, H, dk, dv)``, normaliser ``n`` ``(B, H, dk)`` and stabiliser ``m`` ``(B, H)``.

    The true memory is ``exp(m) C`` (and ``exp(m) n``): ``m`` keeps the exponential gates' scale
    out of ``C`` so that nothing overflows.
    """

    memory: Tensor
    normaliser: Tensor
    stabiliser: Tensor


@dataclass(frozen=True)
class CellRun:
    """The cell's outputs ``(B, H, T, dv)``, its state after and, when asked, after each token (each ``(B, T, ...)``)."""

    out: Tensor
    state: MemoryState
    steps: MemoryState | None = None


def fresh_state(q: Tensor, dv: int) -> MemoryState:
    """Zeros: an empty memory, normaliser and stabiliser (xLSTM starts every sequence from these)."""
    B, H, _, dk = q.shape
    return MemoryState(q.new_zeros(B, H, dk, dv), q.new_zeros(B, H, dk), q.new_zeros(B, H))


def _divide(num: Tensor, den: Tensor, m: Tensor, eps: float) -> Tensor:
    """``num / (max(|den|, exp(-m)) + eps)``: the normaliser never drops below the (unstabilised) one."""
    return num / (torch.maximum(den.abs(), torch.exp(-m)) + eps)


def mlstm_recurrent(q: Tensor, k: Tensor, v: Tensor, i: Tensor, log_f: Tensor, *, state: MemoryState | None = None,
                    eps: float, steps: bool = False) -> CellRun:
    """The mLSTM cell token by token; ``q`` (scaled), ``k`` ``(B, H, T, dk)``, ``v`` ``(B, H, T, dv)``, gates ``(B, H, T)``.

    ``i`` is the input gate's log (its pre-activation), ``log_f`` the forget gate's log.
    """
    s = fresh_state(q, v.shape[-1]) if state is None else state
    c, n, m = s.memory, s.normaliser, s.stabiliser
    outs, kept = [], []
    for t in range(q.shape[2]):
        m_new = torch.maximum(log_f[:, :, t] + m, i[:, :, t])  # (B, H)
        keep = torch.exp(log_f[:, :, t] + m - m_new)  # (B, H)
        write = torch.exp(i[:, :, t] - m_new)
        kt, vt, qt = k[:, :, t], v[:, :, t], q[:, :, t]
        c = keep[..., None, None] * c + write[..., None, None] * kt[..., :, None] * vt[..., None, :]  # (B, H, dk, dv)
        n = keep[..., None] * n + write[..., None] * kt  # (B, H, dk)
        m = m_new
        num = torch.einsum("bhk,bhkv->bhv", qt, c)
        den = torch.einsum("bhk,bhk->bh", qt, n)[..., None]
        outs.append(_divide(num, den, m[..., None], eps))
        if steps:
            kept.append((c, n, m))
    out = torch.stack(outs, dim=2) if outs else v.new_zeros(v.shape)  # (B, H, T, dv)
    per_token = None
    if steps and kept:
        per_token = MemoryState(*(torch.stack([step[j] for step in kept], dim=1) for j in range(3)))
    return CellRun(out=out, state=MemoryState(c, n, m), steps=per_token)


def mlstm_chunked(q: Tensor, k: Tensor, v: Tensor, i: Tensor, log_f: Tensor, *, state: MemoryState | None = None,
                  eps: float, chunk: int) -> CellRun:
    """The same recurrence ``chunk`` tokens at a time, for any length (the last chunk may be shorter).

    Within a chunk, with ``b`` the running sum of the forget logs, token ``t`` reads token
    ``s <= t`` with log weight ``b_t - b_s + i_s`` and the state carried in with ``b_t + m``; the
    stabiliser ``m_t`` is the largest of these (which is what the token-by-token ``m`` is), so
    every exponential is at most 1. The state then moves to the chunk's end the same way.
    """
    s = fresh_state(q, v.shape[-1]) if state is None else state
    c, n, m = s.memory, s.normaliser, s.stabiliser
    outs = []
    for start in range(0, q.shape[2], chunk):
        qc, kc, vc = (x[:, :, start:start + chunk] for x in (q, k, v))  # (B, H, L, d)
        ic = i[:, :, start:start + chunk]  # (B, H, L)
        b = log_f[:, :, start:start + chunk].cumsum(dim=-1)  # (B, H, L)
        L = b.shape[-1]
        causal = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
        # Masked before adding i: a padding token's i is -inf, and -inf + -inf stays -inf (no nan).
        log_d = torch.where(causal, b[..., :, None] - b[..., None, :], float("-inf")) + ic[..., None, :]  # (B, H, L, L)
        carried = b + m[..., None]  # (B, H, L): the log weight of the state carried in
        m_t = torch.maximum(carried, log_d.amax(dim=-1))  # (B, H, L)
        weights = torch.exp(log_d - m_t[..., None]) * (qc @ kc.transpose(-1, -2))  # (B, H, L, L)
        q_carried = qc * torch.exp(carried - m_t)[..., None]  # (B, H, L, dk)
        num = q_carried @ c + weights @ vc  # (B, H, L, dv)
        den = (q_carried @ n[..., None]) + weights.sum(dim=-1, keepdim=True)  # (B, H, L, 1)
        outs.append(_divide(num, den, m_t[..., None], eps))
        # To the chunk's end: each token's log weight there, and the state's.
        to_end = b[..., -1:] - b + ic  # (B, H, L)
        m_end = m_t[..., -1]  # the stabiliser after the chunk's last token
        keep = torch.exp(b[..., -1] + m - m_end)  # (B, H)
        written = kc * torch.exp(to_end - m_end[..., None])[..., None]  # (B, H, L, dk)
        c = keep[..., None, None] * c + written.transpose(-1, -2) @ vc  # (B, H, dk, dv)
        n = keep[..., None] * n + written.sum(dim=2)  # (B, H, dk)
        m = m_end
    out = torch.cat(outs, dim=2) if outs else v.new_zeros(v.shape)
    return CellRun(out=out, state=MemoryState(c, n, m))


def soft_cap(x: Tensor, cap: float | None) -> Tensor:
    """``cap tanh(x / cap)`` (None: ``x``)."""
    return x if cap is None else cap * torch.tanh(x / cap)


class MLSTM(RecurrentMixer):
    """mLSTM token mixer: :class:`MLSTMParams`.

    Module parameters (the names weight mappings rely on), with ``H`` heads, ``K`` = ``qk_dim``
    and ``V`` = ``v_dim``:

    - ``q``, ``k``: Linear ``d_model -> K``; ``v``: Linear ``d_model -> V`` (bias when ``bias``);
    - ``out_gate``: Linear ``d_model -> V``: the sigmoid output gate (bias when ``bias``);
    - ``input_gate``, ``forget_gate``: Linear ``d_model -> H`` with bias: the gates' pre-activations;
    - ``norm_weight`` ``(V,)`` (and ``norm_bias`` when ``bias``): the per-head layer norm's affine;
    - ``out``: Linear ``V -> d_model`` (bias when ``bias``).

    Public facts: ``n_heads`` = ``n_kv_heads`` = ``H``, ``head_dim`` = ``K / H``, ``v_head_dim``,
    ``state_slots`` ``memory`` ``(H, K/H, V/H)``, ``normaliser`` ``(H, K/H)``, ``stabiliser``
    ``(H,)``; nothing per token, no positions.
    """

    Params = MLSTMParams

    def __init__(self, params: MLSTMParams, *, d_model: int, layer_index: int = 0) -> None:
        super().__init__()
        qk, v = params.dims(d_model)
        heads = params.n_heads
        self.layer_index = layer_index
        self.n_heads = heads
        self.n_kv_heads = heads
        self.head_dim = qk // heads
        self.v_head_dim = v // heads
        self.scan_chunk = params.chunk  # not "chunk": that names chunked attention's reach (reach_of)
        self.gate_soft_cap = params.gate_soft_cap
        self.eps = params.eps
        self.norm_eps = params.norm_eps
        self.state_slots = StateSlots((("memory", (heads, self.head_dim, self.v_head_dim)),
                                       ("normaliser", (heads, self.head_dim)), ("stabiliser", (heads,))))
        # Per token beyond the projections: per head the memory's decay and write and its read (dk x dv each).
        self.recurrent_flops_per_token = 5 * heads * self.head_dim * self.v_head_dim

        self.q = nn.Linear(d_model, qk, bias=params.bias)
        self.k = nn.Linear(d_model, qk, bias=params.bias)
        self.v = nn.Linear(d_model, v, bias=params.bias)
        self.out_gate = nn.Linear(d_model, v, bias=params.bias)
        self.input_gate = nn.Linear(d_model, heads, bias=True)
        self.forget_gate = nn.Linear(d_model, heads, bias=True)
        self.norm_weight = nn.Parameter(torch.ones(v))
        self.norm_bias = nn.Parameter(torch.zeros(v)) if params.bias else None
        self.out = nn.Linear(v, d_model, bias=params.bias)

    # -- forward ----------------------------------------------------------------------------

    def run(self, x: Tensor, *, state: dict[str, Tensor] | None = None, padding: Tensor | None = None,
            steps: bool = False) -> MixerRun:
        """The layer on ``x`` ``(B, T, D)`` from ``state`` (zeros when None): output, state after, steps if asked.

        ``padding`` ``(B,)``: tokens opening each row that must leave the state as it was (their
        forget gate is 1 and their input gate 0). A cached forward of at most
        :data:`RECURRENT_MAX_TOKENS` tokens runs token by token, as does one that keeps steps.
        """
        recurrent = steps or (state is not None and x.shape[1] <= RECURRENT_MAX_TOKENS)
        B, T, _ = x.shape
        H = self.n_heads
        work = working_dtype(x.dtype)
        q = self.q(x).reshape(B, T, H, self.head_dim).transpose(1, 2).to(work) * self.head_dim ** -0.5  # (B, H, T, dk)
        k = self.k(x).reshape(B, T, H, self.head_dim).transpose(1, 2).to(work)
        v = self.v(x).reshape(B, T, H, self.v_head_dim).transpose(1, 2).to(work)  # (B, H, T, dv)
        i = soft_cap(self.input_gate(x).to(work), self.gate_soft_cap).transpose(1, 2)  # (B, H, T)
        log_f = F.logsigmoid(soft_cap(self.forget_gate(x).to(work), self.gate_soft_cap)).transpose(1, 2)
        if padding is not None:  # padding forgets nothing and writes nothing: the state stays as it was
            real = (torch.arange(T, device=x.device)[None, :] >= padding[:, None])[:, None, :]  # (B, 1, T)
            log_f = torch.where(real, log_f, 0.0)
            i = torch.where(real, i, float("-inf"))
        held = None if state is None else MemoryState(*(state[name].to(work) for name in
                                                        ("memory", "normaliser", "stabiliser")))
        if recurrent:
            run = mlstm_recurrent(q, k, v, i, log_f, state=held, eps=self.eps, steps=steps)
        else:
            run = mlstm_chunked(q, k, v, i, log_f, state=held, eps=self.eps, chunk=self.scan_chunk)
        h = F.layer_norm(run.out.transpose(1, 2), (self.v_head_dim,), eps=self.norm_eps)  # (B, T, H, dv) per head
        h = h.reshape(B, T, H * self.v_head_dim) * self.norm_weight.to(work)
        if self.norm_bias is not None:
            h = h + self.norm_bias.to(work)
        y = torch.sigmoid(self.out_gate(x)) * h.to(x.dtype)
        after = {"memory": run.state.memory, "normaliser": run.state.normaliser, "stabiliser": run.state.stabiliser}
        kept = None
        if steps and run.steps is not None:
            kept = {"memory": run.steps.memory, "normaliser": run.steps.normaliser, "stabiliser": run.steps.stabiliser}
        return MixerRun(out=self.out(y), state=after, steps=kept)

    # -- facts and initialisation ---------------------------------------------------------------

    def describe_kernel(self, *, bias: bool = False) -> str:
        """The kernel this layer runs, in words (``specformer summary``); ``bias`` changes nothing here."""
        return (f"torch mLSTM by chunks (chunk {self.scan_chunk}, max-stabilised); token by token for cached "
                f"forwards of <= {RECURRENT_MAX_TOKENS} tokens")

    def extra_repr(self) -> str:
        return (f"n_heads={self.n_heads}, head_dim={self.head_dim}, v_head_dim={self.v_head_dim}, "
                f"chunk={self.scan_chunk}, gate_soft_cap={self.gate_soft_cap}")

    @torch.no_grad()
    def init_weights(self, *, std: float, residual_std: float) -> None:
        """Projections normal(std), out normal(residual_std); the gates as xLSTM starts them.

        Gate weights zero, the input gate's bias -10 (writes start tiny) and the forget gate's
        biases spread over 3..6 across the heads (memories start long), as xLSTM-7B initialises.
        """
        for linear in (self.q, self.k, self.v, self.out_gate):
            nn.init.normal_(linear.weight, std=std)
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)
        nn.init.normal_(self.out.weight, std=residual_std)  # feeds the residual stream
        if self.out.bias is not None:
            nn.init.zeros_(self.out.bias)
        nn.init.zeros_(self.input_gate.weight)
        nn.init.constant_(self.input_gate.bias, -10.0)
        nn.init.zeros_(self.forget_gate.weight)
        self.forget_gate.bias.copy_(torch.linspace(3.0, 6.0, self.n_heads))
        nn.init.ones_(self.norm_weight)
        if self.norm_bias is not None:
            nn.init.zeros_(self.norm_bias)


__all__ = ["MLSTM", "MemoryState", "mlstm_chunked", "mlstm_recurrent", "soft_cap"]
