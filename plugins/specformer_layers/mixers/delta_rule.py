"""The gated delta rule: a matrix state per head, decayed, then corrected towards each new key-value pair.

Per head, the state ``S`` ``(dk, dv)`` maps keys to values. At token ``t``, with key ``k_t``
``(dk,)``, value ``v_t`` ``(dv,)``, write strength ``beta_t`` and log-decay ``g_t``::

    S_t = (I - beta_t k_t k_t^T) Diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T
    o_t = S_t^T (scale * q_t)

that is: decay the state (row ``c`` by ``exp(g_t[c])``), read what it predicts for ``k_t``,
and move that prediction a ``beta_t`` of the way to ``v_t``. ``g_t`` is one number per head
(Gated DeltaNet, Yang et al. 2024, arXiv:2412.06464: ``log_decay`` ``(B, H, T)``) or one per
key channel (Kimi Delta Attention: ``log_decay`` ``(B, H, T, dk)``); both forms take both.
This is the order transformers' torch paths use for Qwen3-Next and Kimi Linear (decay first,
then the delta update, then the read).

A token with ``beta = 0`` and ``log_decay = 0`` leaves the state exactly as it was: that is
how a mixer keeps padding out of it.

Two forms compute the same thing:

- :func:`delta_rule_recurrent`: token by token (decoding; and the state after every token
  when asked, for speculative decoding's rollback);
- :func:`delta_rule_chunked`: chunks of ``chunk`` tokens, each chunk's updates solved at once
  (the WY/UT form of DeltaNet, Yang et al. 2024, arXiv:2406.06484) and the state carried from
  chunk to chunk (training and prefill).

Queries and keys are used as given: normalising them (all three Gated DeltaNet families
L2-normalise both) is the caller's business. The query scale is a parameter (default
``dk ** -0.5``, what every family uses). Everything is computed in float32 (float64 for
float64 inputs); outputs, states and steps come back in the dtype of ``v``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass
class DeltaRuleOutput:
    """What the delta rule returns."""

    out: Tensor  # (B, H, T, dv): o_t = S_t^T (scale * q_t)
    state: Tensor  # (B, H, dk, dv): the state after the last token
    steps: Tensor | None = None  # (B, T, H, dk, dv): the state after each token, when asked for


def delta_rule_recurrent(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_decay: Tensor, *,
                         state: Tensor | None = None, scale: float | None = None,
                         steps: bool = False) -> DeltaRuleOutput:
    """The gated delta rule token by token (see the module doc for the recurrence).

    ``q``, ``k`` ``(B, H, T, dk)``; ``v`` ``(B, H, T, dv)``; ``beta`` ``(B, H, T)``;
    ``log_decay`` ``(B, H, T)`` (per head) or ``(B, H, T, dk)`` (per key channel), ``<= 0``
    in use; ``state`` ``(B, H, dk, dv)``, the state before the first token (zeros when None);
    ``scale`` multiplies the queries (default ``dk ** -0.5``); ``steps``: also return the
    state after each token ``(B, T, H, dk, dv)``.
    """
    dtype = v.dtype
    q, k, v, beta, decay, s = _float32(q, k, v, beta, log_decay, state)
    q = q * _scale(scale, q)
    length = q.shape[2]
    # Per head (B, H, T, 1, 1) or per key channel (B, H, T, dk, 1): what multiplies the state's rows.
    factor = decay.exp()[..., None] if decay.dim() == 4 else decay.exp()[..., None, None]
    outs = []
    kept = [] if steps else None
    for t in range(length):
        s = s * factor[:, :, t]  # (B, H, dk, dv)
        k_t = k[:, :, t]  # (B, H, dk)
        predicted = torch.einsum("bhk,bhkv->bhv", k_t, s)
        correction = beta[:, :, t, None] * (v[:, :, t] - predicted)  # (B, H, dv)
        s = s + k_t[..., :, None] * correction[..., None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], s))
        if kept is not None:
            kept.append(s)
    out = torch.stack(outs, dim=2) if outs else v.new_zeros(v.shape)  # (B, H, T, dv)
    all_steps = None
    if kept is not None:
        all_steps = (torch.stack(kept, dim=1) if kept else s.new_zeros((s.shape[0], 0, *s.shape[1:]))).to(dtype)
    return DeltaRuleOutput(out=out.to(dtype), state=s.to(dtype), steps=all_steps)


def delta_rule_chunked(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_decay: Tensor, *,
                       state: Tensor | None = None, scale: float | None = None, chunk: int = 64) -> DeltaRuleOutput:
    """The gated delta rule by chunks of ``chunk`` tokens; same arguments and results as :func:`delta_rule_recurrent`.

    Within a chunk, with ``G_t`` the log-decay summed from the chunk's start through ``t`` and
    ``S_0`` the state before the chunk, the state after token ``t`` is
    ``Diag(e^{G_t}) S_0 + sum_{j<=t} Diag(e^{G_t - G_j}) k_j u_j^T``, where the corrections
    ``u_j`` solve one unit lower-triangular system per chunk::

        u_t + beta_t sum_{j<t} (k_t . e^{G_t - G_j} k_j) u_j = beta_t (v_t - S_0^T (e^{G_t} k_t))

    Every exponent is ``<= 0`` for decays ``<= 0`` (later minus earlier), so nothing overflows.
    A per-channel decay makes the in-chunk scores a sum over channels that no single matmul
    gives: they are formed as ``(chunk, chunk, dk)`` per chunk, which is why chunks are solved
    one after the other (memory ``B * H * chunk^2 * dk``, not times the chunks). A length that
    is not a multiple of ``chunk`` is padded with tokens that leave the state alone.
    """
    if chunk < 1:
        raise ValueError(f"chunk must be a positive number of tokens, got {chunk}")
    dtype = v.dtype
    q, k, v, beta, decay, s = _float32(q, k, v, beta, log_decay, state)
    q = q * _scale(scale, q)
    length = q.shape[2]
    pad = -length % chunk
    if pad:  # beta 0 and decay 0: the padded tokens change nothing
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        beta = F.pad(beta, (0, pad))
        decay = F.pad(decay, (0, 0, 0, pad)) if decay.dim() == 4 else F.pad(decay, (0, pad))
    per_channel = decay.dim() == 4
    size = q.shape[2] // chunk

    def chunked(x: Tensor) -> Tensor:  # (B, H, N*C, ...) -> (B, H, N, C, ...)
        return x.reshape(*x.shape[:2], size, chunk, *x.shape[3:])

    q, k, v, beta, decay = map(chunked, (q, k, v, beta, decay))
    cumulative = decay.cumsum(dim=3)  # G: (B, H, N, C) or (B, H, N, C, dk)
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()  # j <= t
    strictly_lower = lower.tril(-1)  # j < t
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    outs = []
    for n in range(size):
        q_n, k_n, v_n, b_n, g_n = q[:, :, n], k[:, :, n], v[:, :, n], beta[:, :, n], cumulative[:, :, n]
        # e^{G_t} per channel (or per head, broadcast over the channels): (B, H, C, dk) or (B, H, C, 1)
        grown = (g_n if per_channel else g_n[..., None]).exp()
        # System: (I + diag(beta) A) u = diag(beta) (v - (e^{G} k) S_0), with A_tj = k_t . e^{G_t - G_j} k_j (j < t).
        system = eye + b_n[..., None] * _decayed_scores(k_n, k_n, g_n, strictly_lower, per_channel)  # (B, H, C, C)
        target = b_n[..., None] * (v_n - (grown * k_n) @ s)  # (B, H, C, dv)
        u = torch.linalg.solve_triangular(system, target, upper=False, unitriangular=True)  # (B, H, C, dv)
        # o_t = S_0^T (e^{G_t} q_t) + sum_{j<=t} (q_t . e^{G_t - G_j} k_j) u_j
        scores = _decayed_scores(q_n, k_n, g_n, lower, per_channel)  # (B, H, C, C)
        outs.append((grown * q_n) @ s + scores @ u)
        last = g_n[:, :, -1:]  # G at the chunk's end: (B, H, 1, dk) or (B, H, 1)
        # S_C = Diag(e^{G_C}) S_0 + sum_j (e^{G_C - G_j} k_j) u_j^T
        if per_channel:
            s = last.transpose(-1, -2).exp() * s + ((last - g_n).exp() * k_n).transpose(-1, -2) @ u
        else:
            s = last[..., None].exp() * s + ((last - g_n)[..., None].exp() * k_n).transpose(-1, -2) @ u
    out = torch.cat(outs, dim=2)[:, :, :length] if outs else v.new_zeros((*v.shape[:2], 0, v.shape[-1]))
    return DeltaRuleOutput(out=out.to(dtype), state=s.to(dtype))


def _decayed_scores(a: Tensor, b: Tensor, cumulative: Tensor, mask: Tensor, per_channel: bool) -> Tensor:
    """``(B, H, C, C)``: ``sum_c a_tc b_jc e^{G_tc - G_jc}`` where ``mask[t, j]``, zero elsewhere.

    ``a``, ``b`` ``(B, H, C, dk)``; ``cumulative`` ``G`` ``(B, H, C, dk)`` or ``(B, H, C)``.
    The exponent is masked to ``-inf`` outside ``mask`` before ``exp`` (there it would be
    positive and could overflow).
    """
    if per_channel:
        exponent = cumulative[..., :, None, :] - cumulative[..., None, :, :]  # (B, H, C, C, dk)
        exponent = exponent.masked_fill(~mask[..., None], float("-inf"))
        return torch.einsum("bhtc,bhjc,bhtjc->bhtj", a, b, exponent.exp())
    exponent = (cumulative[..., :, None] - cumulative[..., None, :]).masked_fill(~mask, float("-inf"))  # (B, H, C, C)
    return (a @ b.transpose(-1, -2)) * exponent.exp()


def _float32(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_decay: Tensor,
             state: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The inputs in float32 (float64 if ``v`` is), shapes checked, and the initial state (zeros when None)."""
    batch, heads, length, key_dim = q.shape
    value_dim = v.shape[-1]
    if k.shape != q.shape or v.shape[:3] != q.shape[:3] or beta.shape != q.shape[:3]:
        raise ValueError(f"delta rule: q and k (B, H, T, dk), v (B, H, T, dv) and beta (B, H, T) must agree, got "
                         f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, beta {tuple(beta.shape)}")
    if log_decay.shape not in (q.shape[:3], q.shape):
        raise ValueError(f"delta rule: log_decay must be (B, H, T) (per head) or (B, H, T, dk) (per key channel), "
                         f"{tuple(q.shape[:3])} or {tuple(q.shape)} here, got {tuple(log_decay.shape)}")
    shape = (batch, heads, key_dim, value_dim)
    if state is not None and state.shape != shape:
        raise ValueError(f"delta rule: state must be (B, H, dk, dv) = {shape}, got {tuple(state.shape)}")
    dtype = torch.promote_types(v.dtype, torch.float32)
    s = q.new_zeros(shape, dtype=dtype) if state is None else state.to(dtype)
    q, k, v, beta, log_decay = (x.to(dtype) for x in (q, k, v, beta, log_decay))
    return q, k, v, beta, log_decay, s


def _scale(scale: float | None, q: Tensor) -> float:
    return q.shape[-1] ** -0.5 if scale is None else scale


__all__ = ["DeltaRuleOutput", "delta_rule_chunked", "delta_rule_recurrent"]
