"""Mamba-2's scan (state-space duality): a selective state-space recurrence, in two equal forms.

Per head ``h`` the state ``S`` ``(P, N)`` evolves token by token::

    S_t = exp(dt_t * A_h) * S_{t-1} + dt_t * x_t B_t^T        (x_t: (P,), B_t: (N,))
    y_t = S_t C_t + D_h * x_t

with ``dt`` ``> 0`` the token's step, ``A`` ``< 0`` the head's decay rate, and ``B``, ``C``
shared by the heads of a group (Dao & Gu 2024, arXiv:2405.21060). :func:`ssd_recurrent` runs
exactly that (decoding, and the per-token states speculative decoding rolls back to).
:func:`ssd_chunked` computes the same outputs a chunk at a time: inside a chunk the
recurrence unrolls into a masked, decay-weighted ``C B^T`` product (attention-like, the
"dual" form), and only the states at chunk boundaries are carried from one chunk to the next.

A token with ``dt = 0`` decays nothing and writes nothing: it leaves the state unchanged,
which is how padding is kept out. Everything is computed in float32 at least (float64 stays float64).
"""

from __future__ import annotations

import torch
from torch import Tensor


def working_dtype(dtype: torch.dtype) -> torch.dtype:
    """What the scan computes in: float32 for half precision, the dtype itself when wider."""
    return torch.promote_types(dtype, torch.float32)


def _per_head(groups: Tensor, heads: int, dtype: torch.dtype) -> Tensor:
    """``(B, T, G, N)`` -> ``(B, T, H, N)``: each group's vector repeated for its ``H / G`` consecutive heads."""
    return groups.to(dtype).repeat_interleave(heads // groups.shape[2], dim=2)


def _check(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor) -> None:
    heads, groups = x.shape[2], B.shape[2]
    if dt.shape != x.shape[:3] or A.shape != (heads,) or B.shape != C.shape or B.shape[:2] != x.shape[:2]:
        raise ValueError(f"ssd: shapes do not fit: x {tuple(x.shape)}, dt {tuple(dt.shape)}, A {tuple(A.shape)}, "
                         f"B {tuple(B.shape)}, C {tuple(C.shape)}")
    if heads % groups:
        raise ValueError(f"ssd: the groups of B and C ({groups}) must divide the heads of x ({heads})")


def ssd_recurrent(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, *, D: Tensor | None = None,
                  state: Tensor | None = None, steps: bool = False) -> tuple[Tensor, Tensor, Tensor | None]:
    """The recurrence token by token.

    ``x`` ``(B, T, H, P)``, ``dt`` ``(B, T, H)`` (already positive), ``A`` ``(H,)`` (negative),
    ``B`` and ``C`` ``(B, T, G, N)``, ``D`` ``(H,)``, ``state`` ``(B, H, P, N)`` before the first
    token (zeros when None). Returns the outputs ``(B, T, H, P)`` (float32 or wider), the state after
    the last token ``(B, H, P, N)`` and, with ``steps``, the state after each token
    ``(B, T, H, P, N)``.
    """
    _check(x, dt, A, B, C)
    batch, length, heads, head_dim = x.shape
    work = working_dtype(x.dtype)
    x, dt = x.to(work), dt.to(work)
    B, C = _per_head(B, heads, work), _per_head(C, heads, work)  # (B, T, H, N)
    decay = torch.exp(dt * A.to(work))  # (B, T, H)
    s = x.new_zeros((batch, heads, head_dim, B.shape[-1])) if state is None else state.to(work)
    outs, kept = [], []
    for t in range(length):
        write = (dt[:, t, :, None] * x[:, t])[..., None] * B[:, t, :, None, :]  # (B, H, P, N)
        s = decay[:, t, :, None, None] * s + write
        outs.append(torch.einsum("bhpn,bhn->bhp", s, C[:, t]))
        if steps:
            kept.append(s)
    y = torch.stack(outs, dim=1) if outs else x.new_zeros(x.shape)  # (B, T, H, P)
    if D is not None:
        y = y + D.to(work)[:, None] * x
    return y, s, (torch.stack(kept, dim=1) if steps else None)


def ssd_chunked(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, *, chunk: int, D: Tensor | None = None,
                state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The same recurrence, ``chunk`` tokens at a time (any ``T``: the last chunk is filled with ``dt = 0``).

    Arguments and results as :func:`ssd_recurrent` (without the per-token states).
    """
    _check(x, dt, A, B, C)
    if chunk < 1:
        raise ValueError(f"ssd: chunk must be positive, got {chunk}")
    batch, length, heads, head_dim = x.shape
    size = B.shape[-1]
    work = working_dtype(x.dtype)
    x, dt = x.to(work), dt.to(work)
    B, C = _per_head(B, heads, work), _per_head(C, heads, work)  # (B, T, H, N)
    fill = -length % chunk
    if fill:
        # dt = 0 tokens after the last: they neither decay nor write the state, and their outputs are cut.
        def pad(t: Tensor) -> Tensor:
            return torch.cat((t, t.new_zeros((batch, fill, *t.shape[2:]))), dim=1)
        x, dt, B, C = pad(x), pad(dt), pad(B), pad(C)
    n_chunks = x.shape[1] // chunk
    xc = x.view(batch, n_chunks, chunk, heads, head_dim)  # (B, c, l, H, P)
    dtc = dt.view(batch, n_chunks, chunk, heads)  # (B, c, l, H)
    Bc = B.view(batch, n_chunks, chunk, heads, size)  # (B, c, l, H, N)
    Cc = C.view(batch, n_chunks, chunk, heads, size)
    log_decay = torch.cumsum(dtc * A.to(work), dim=2)  # (B, c, l, H): log of the decay from the chunk's start to l

    # Within a chunk: y_l += sum_{s <= l} exp(log_decay_l - log_decay_s) (C_l . B_s) dt_s x_s.
    gap = log_decay[:, :, :, None, :] - log_decay[:, :, None, :, :]  # (B, c, l, s, H)
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=x.device).tril()[None, None, :, :, None]
    # Masked before exp: above the diagonal the gap is positive and could overflow.
    weights = torch.exp(torch.where(causal, gap, torch.full_like(gap, float("-inf"))))
    scores = torch.einsum("bclhn,bcshn->bclsh", Cc, Bc) * weights  # (B, c, l, s, H)
    written = dtc[..., None] * xc  # (B, c, l, H, P)
    y = torch.einsum("bclsh,bcshp->bclhp", scores, written)

    # What each chunk adds to the state by its end, then the state entering each chunk, chunk after chunk.
    to_end = torch.exp(log_decay[:, :, -1:, :] - log_decay)  # (B, c, l, H)
    added = torch.einsum("bclhn,bclhp->bchpn", Bc * to_end[..., None], written)  # (B, c, H, P, N)
    across = torch.exp(log_decay[:, :, -1, :])  # (B, c, H): decay over a whole chunk
    s = x.new_zeros((batch, heads, head_dim, size)) if state is None else state.to(work)
    entering = []
    for c in range(n_chunks):
        entering.append(s)
        s = across[:, c, :, None, None] * s + added[:, c]
    starts = torch.stack(entering, dim=1)  # (B, c, H, P, N)

    # From the state entering the chunk: y_l += exp(log_decay_l) C_l S_start.
    y = y + torch.einsum("bclhn,bchpn->bclhp", Cc, starts) * torch.exp(log_decay)[..., None]
    y = y.reshape(batch, n_chunks * chunk, heads, head_dim)[:, :length]  # (B, T, H, P)
    if D is not None:
        y = y + D.to(work)[:, None] * x[:, :length]
    return y, s


__all__ = ["ssd_chunked", "ssd_recurrent", "working_dtype"]
