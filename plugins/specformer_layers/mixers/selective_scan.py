"""Mamba-1's selective scan: a state per channel and state dimension, in two equal forms.

Per channel ``d`` and state dimension ``n`` the state ``h`` evolves token by token::

    h_t[d, n] = exp(dt_t[d] * A[d, n]) * h_{t-1}[d, n] + dt_t[d] * B_t[n] * x_t[d]
    y_t[d]    = sum_n C_t[n] * h_t[d, n] + D[d] * x_t[d]

with ``dt`` ``> 0`` the token's step per channel, ``A`` ``< 0`` the decay rates (per channel
*and* state dimension, unlike Mamba-2's one per head) and ``B``, ``C`` shared by all channels
(Gu & Dao 2023, "Mamba", arXiv:2312.00752, Algorithm 2). :func:`selective_scan_recurrent` runs
exactly that (decoding, and the per-token states speculative decoding rolls back to).

:func:`selective_scan_chunked` computes the same, ``chunk`` tokens at a time: the recurrence is a
first-order linear one, ``h_t = a_t h_{t-1} + b_t``, whose steps compose associatively
(``(a1, b1)`` then ``(a2, b2)`` is ``(a2 a1, a2 b1 + b2)``), so inside a chunk every prefix is
found in ``log2(chunk)`` doubling steps (Hillis & Steele) over the whole chunk at once instead
of one Python step per token; only the state at each chunk's end is carried to the next. Every
factor is a decay in ``(0, 1]``, so no step divides or grows: it is as stable as the loop.
Mamba-2's state-space-dual form does not apply: its decay is one scalar per head, here it varies
over the state dimension, and the dual form's ``(l, s)`` decay matrix would be per ``(d, n)``.

A token with ``dt = 0`` decays nothing and writes nothing: it leaves the state unchanged,
which is how padding is kept out. Everything is computed in float32 at least (float64 stays float64).
"""

from __future__ import annotations

import torch
from torch import Tensor

from specformer_layers.mixers.ssd import working_dtype


def _check(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor) -> None:
    if (dt.shape != x.shape or A.shape[0] != x.shape[2] or A.dim() != 2 or B.shape != C.shape
            or B.shape[:2] != x.shape[:2] or B.shape[2] != A.shape[1]):
        raise ValueError(f"selective scan: shapes do not fit: x {tuple(x.shape)}, dt {tuple(dt.shape)}, "
                         f"A {tuple(A.shape)}, B {tuple(B.shape)}, C {tuple(C.shape)}")


def _terms(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, work: torch.dtype) -> tuple[Tensor, Tensor]:
    """The recurrence's ``a_t = exp(dt A)`` and ``b_t = dt B x``, both ``(B, T, D, N)``."""
    decay = torch.exp(dt.to(work)[..., None] * A.to(work))  # (B, T, D, N)
    write = (dt.to(work) * x.to(work))[..., None] * B.to(work)[:, :, None, :]  # (B, T, D, N)
    return decay, write


def _skip(y: Tensor, x: Tensor, D: Tensor | None) -> Tensor:
    return y if D is None else y + D.to(y.dtype) * x.to(y.dtype)


def selective_scan_recurrent(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, *, D: Tensor | None = None,
                             state: Tensor | None = None, steps: bool = False
                             ) -> tuple[Tensor, Tensor, Tensor | None]:
    """The recurrence token by token.

    ``x`` and ``dt`` ``(B, T, D)`` (``dt`` already positive), ``A`` ``(D, N)`` (negative), ``B`` and
    ``C`` ``(B, T, N)``, ``D`` ``(D,)``, ``state`` ``(B, D, N)`` before the first token (zeros when
    None). Returns the outputs ``(B, T, D)`` (float32 or wider), the state after the last token
    ``(B, D, N)`` and, with ``steps``, the state after each token ``(B, T, D, N)``.
    """
    _check(x, dt, A, B, C)
    batch, length, channels = x.shape
    work = working_dtype(x.dtype)
    decay, write = _terms(x, dt, A, B, work)
    C = C.to(work)
    h = x.new_zeros((batch, channels, A.shape[1]), dtype=work) if state is None else state.to(work)
    outs, kept = [], []
    for t in range(length):
        h = decay[:, t] * h + write[:, t]
        outs.append(torch.einsum("bdn,bn->bd", h, C[:, t]))
        if steps:
            kept.append(h)
    y = torch.stack(outs, dim=1) if outs else x.new_zeros(x.shape, dtype=work)  # (B, T, D)
    return _skip(y, x, D), h, (torch.stack(kept, dim=1) if steps else None)


def linear_recurrence(a: Tensor, b: Tensor, h: Tensor) -> Tensor:
    """Every state of ``h_t = a_t * h_{t-1} + b_t`` from ``h`` ``(B, *S)``: ``(B, l, *S)``, ``a`` and ``b`` ``(B, l, *S)``.

    By doubling over the ``l`` tokens at once (``log2(l)`` steps, no Python step per token); with
    every ``a_t`` in ``[0, 1]`` nothing divides or grows. Used a chunk at a time.
    """
    # After the step with shift k, (a_t, b_t) composes the 2k tokens ending at t (fewer at the start).
    shift = 1
    while shift < a.shape[1]:
        b = torch.cat((b[:, :shift], a[:, shift:] * b[:, :-shift] + b[:, shift:]), dim=1)
        a = torch.cat((a[:, :shift], a[:, shift:] * a[:, :-shift]), dim=1)
        shift *= 2
    return a * h[:, None] + b


def selective_scan_chunked(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, *, chunk: int,
                           D: Tensor | None = None, state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The same recurrence, ``chunk`` tokens at a time, each chunk by doubling steps (any ``T``).

    Arguments and results as :func:`selective_scan_recurrent` (without the per-token states).
    """
    _check(x, dt, A, B, C)
    if chunk < 1:
        raise ValueError(f"selective scan: chunk must be positive, got {chunk}")
    batch, length, channels = x.shape
    work = working_dtype(x.dtype)
    C = C.to(work)
    h = x.new_zeros((batch, channels, A.shape[1]), dtype=work) if state is None else state.to(work)
    outs = []
    for start in range(0, length, chunk):
        end = min(start + chunk, length)
        a, b = _terms(x[:, start:end], dt[:, start:end], A, B[:, start:end], work)  # (B, l, D, N) each
        states = linear_recurrence(a, b, h)  # (B, l, D, N): the state after each token of the chunk
        outs.append(torch.einsum("bldn,bln->bld", states, C[:, start:end]))
        h = states[:, -1]
    y = torch.cat(outs, dim=1) if outs else x.new_zeros(x.shape, dtype=work)  # (B, T, D)
    return _skip(y, x, D), h


__all__ = ["linear_recurrence", "selective_scan_chunked", "selective_scan_recurrent"]
