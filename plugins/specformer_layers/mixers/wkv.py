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
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

#: What a fresh state's exponent is read as (transformers' -1e38): below any key, finite.
FRESH_EXPONENT = -1e38


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
    batch, length, width = k.shape
    work = torch.promote_types(k.dtype, torch.float32)
    k, v, w, u = k.to(work), v.to(work), decay.to(work), bonus.to(work)
    if state is None:
        num = k.new_zeros(batch, width)
        den = k.new_zeros(batch, width)
        p = k.new_full((batch, width), FRESH_EXPONENT)
    else:
        num, den = state.num.to(work), state.den.to(work)
        p = torch.where(den > 0, state.exponent.to(work), FRESH_EXPONENT)  # a fresh channel's exponent
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


__all__ = ["FRESH_EXPONENT", "WKVState", "wkv"]
