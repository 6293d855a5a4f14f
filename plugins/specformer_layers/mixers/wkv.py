"""RWKV-4's WKV recurrence in its numerically stable form: :func:`wkv`.

Per channel, the state is a numerator ``a`` and denominator ``b`` (the decayed sums of
``e^k v`` and ``e^k``), kept as ``a = num e^p``, ``b = den e^p`` with ``p`` the largest
exponent seen, so no ``e^k`` is ever formed on its own (keys in the tens would overflow).
Each token ``t``, with decay ``w > 0`` and bonus ``u``::

    q = max(p, u + k_t)                      # the output, the current token favoured by u
    wkv_t = (e^{p-q} num + e^{u+k_t-q} v_t) / (e^{p-q} den + e^{u+k_t-q})
    p' = max(p - w, k_t)                     # the state, decayed once, the token added
    num' = e^{p-w-p'} num + e^{k_t-p'} v_t;   den' = e^{p-w-p'} den + e^{k_t-p'}

A fresh state has ``num = den = 0``: a cache holds zeros, and ``den`` is positive once a
token is in (one of the two factors above is 1), so ``den == 0`` marks a fresh channel and
its ``p`` is read as minus infinity (a large negative number: ``-inf - -inf`` is NaN).

Two forms compute it: :func:`wkv` token by token (decoding, and whenever the state after each
token is kept), and :func:`wkv_chunked` a chunk of tokens at a time (prefill and training),
which keeps the same state, so either can continue what the other left.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

#: What a fresh state's exponent is read as (transformers' -1e38): below any key, finite.
FRESH_EXPONENT = -1e38
#: Tokens per chunk of :func:`wkv_chunked`: its pairwise weights are ``(B, C, C, W)`` per chunk.
CHUNK = 32


@dataclass(frozen=True)
class WKVState:
    """The running numerator, denominator and their exponent, each ``(B, W)`` (or ``(B, T, W)`` per token)."""

    num: Tensor
    den: Tensor
    exponent: Tensor


def wkv(k: Tensor, v: Tensor, *, decay: Tensor, bonus: Tensor, state: WKVState | None = None,
        real: Tensor | None = None, steps: bool = False) -> tuple[Tensor, WKVState, WKVState | None]:
    """The WKV of ``k``, ``v`` ``(B, T, W)`` from ``state`` (None: fresh), token by token, in float32 or wider.

    ``decay`` ``(W,)``: ``w = exp(time_decay)`` (the state is multiplied by ``e^-w`` per token);
    ``bonus`` ``(W,)``: ``u = time_first``. ``real`` ``(B, T)`` bool: False for a padding token,
    which leaves the state as it was and gives 0 (None: all real). Returns the output
    ``(B, T, W)``, the state after the last token and, with ``steps``, the state after each.
    """
    work = torch.promote_types(k.dtype, torch.float32)
    k, v, w, u = k.to(work), v.to(work), decay.to(work), bonus.to(work)
    num, den, p = _start(state, k)
    length = k.shape[1]
    outs, kept = [], []
    for t in range(length):
        kt, vt = k[:, t], v[:, t]  # (B, W)
        q = torch.maximum(p, u + kt)
        before, now = torch.exp(p - q), torch.exp(u + kt - q)
        out = (before * num + now * vt) / (before * den + now)
        q = torch.maximum(p - w, kt)
        before, now = torch.exp(p - w - q), torch.exp(kt - q)
        new = (before * num + now * vt, before * den + now, q)
        if real is not None:  # padding: the state as it was, the output 0
            keep = real[:, t, None]  # (B, 1)
            out = torch.where(keep, out, 0.0)
            new = tuple(torch.where(keep, n, o) for n, o in zip(new, (num, den, p)))
        num, den, p = new
        outs.append(out)
        if steps:
            kept.append(new)
    out = torch.stack(outs, dim=1) if outs else k.new_zeros(k.shape)  # (B, T, W)
    per_token = None
    if steps:
        per_token = WKVState(*(torch.stack(parts, dim=1) if parts else k.new_zeros(k.shape) for parts in zip(*kept))) \
            if kept else WKVState(k.new_zeros(k.shape), k.new_zeros(k.shape), k.new_zeros(k.shape))
    return out, WKVState(num, den, p), per_token


def wkv_chunked(k: Tensor, v: Tensor, *, decay: Tensor, bonus: Tensor, state: WKVState | None = None,
                real: Tensor | None = None, chunk: int = CHUNK) -> tuple[Tensor, WKVState]:
    """:func:`wkv` ``chunk`` tokens at a time (the last chunk may be shorter): the output and the state after.

    Within a chunk, with ``n_t`` the real tokens of the chunk before token ``t`` and ``c_i``
    those up to and including ``i``, token ``t`` reads token ``i < t`` with log weight
    ``k_i - (n_t - c_i) w`` (the decays between them: ``k_i - (t-1-i) w`` without padding),
    itself with ``u + k_t``, and the state carried in with ``p - n_t w``. Each output row is
    stabilised by the largest of its log weights (the ``q`` of the token loop), so every
    exponential is at most 1 whatever the keys. The state then moves to the chunk's end the
    same way: ``p' = max(p - c w, k_i - (c - c_i) w)`` over the real tokens (``c`` of them), the
    ``p`` the token loop reaches. A padding token (``real`` False) reads nothing, writes nothing
    and decays nothing, and gives 0, as in :func:`wkv`.
    """
    if chunk < 1:
        raise ValueError(f"wkv_chunked: chunk must be a positive number of tokens, got {chunk}")
    batch, length, width = k.shape
    work = torch.promote_types(k.dtype, torch.float32)
    k, v, w, u = k.to(work), v.to(work), decay.to(work), bonus.to(work)
    num, den, p = _start(state, k)
    if real is None:
        real = torch.ones(batch, length, dtype=torch.bool, device=k.device)
    outs = []
    for start in range(0, length, chunk):
        kc, vc, rc = k[:, start:start + chunk], v[:, start:start + chunk], real[:, start:start + chunk]  # (B, C, W), (B, C)
        c = kc.shape[1]
        upto = rc.cumsum(dim=1).to(work)[..., None]  # (B, C, 1): c_i, real tokens up to and including i
        before = upto - rc[..., None].to(work)  # (B, C, 1): n_t, real tokens before t
        written = torch.where(rc[..., None], kc, float("-inf"))  # (B, C, W): padding writes nothing
        earlier = torch.ones(c, c, dtype=torch.bool, device=k.device).tril(diagonal=-1)[None, :, :, None]  # i < t
        # (B, C_t, C_i, W); masked (not just huge) where i >= t, so no exp of a positive number is formed.
        pair = torch.where(earlier, written[:, None] - w * (before[:, :, None] - upto[:, None]), float("-inf"))
        own = u + kc  # (B, C, W): the current token, with its bonus
        carried = p[:, None] - w * before  # (B, C, W): the state carried in, decayed to just before t
        q = torch.maximum(torch.maximum(carried, own), pair.amax(dim=2))  # (B, C, W), finite
        weights = torch.exp(pair - q[:, :, None])  # (B, C, C, W)
        from_state, from_own = torch.exp(carried - q), torch.exp(own - q)
        top = from_state * num[:, None] + from_own * vc + (weights * vc[:, None]).sum(dim=2)
        bottom = from_state * den[:, None] + from_own + weights.sum(dim=2)
        outs.append(torch.where(rc[..., None], top / bottom, 0.0))
        # The state after the chunk, relative to its new largest exponent.
        total = upto[:, -1]  # (B, 1): real tokens in the chunk
        to_end = written - w * (total[:, None] - upto)  # (B, C, W)
        kept = p - w * total  # (B, W)
        p_end = torch.maximum(kept, to_end.amax(dim=1))
        keep, add = torch.exp(kept - p_end), torch.exp(to_end - p_end[:, None])
        num = keep * num + (add * vc).sum(dim=1)
        den = keep * den + add.sum(dim=1)
        p = p_end
    out = torch.cat(outs, dim=1) if outs else k.new_zeros(k.shape)  # (B, T, W)
    return out, WKVState(num, den, p)


def _start(state: WKVState | None, k: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The numerator, denominator and exponent to start from ``(B, W)``, in ``k``'s dtype (fresh: zeros and -1e38)."""
    batch, _, width = k.shape
    if state is None:
        return k.new_zeros(batch, width), k.new_zeros(batch, width), k.new_full((batch, width), FRESH_EXPONENT)
    num, den = state.num.to(k.dtype), state.den.to(k.dtype)
    return num, den, torch.where(den > 0, state.exponent.to(k.dtype), FRESH_EXPONENT)  # a fresh channel's exponent


__all__ = ["CHUNK", "FRESH_EXPONENT", "WKVState", "wkv", "wkv_chunked"]
