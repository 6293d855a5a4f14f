"""Pooling blocks of tokens into compressed entries (DeepSeek-V4's compressors), in training and through a cache.

A pooler projects every token to values ``C = x W_kv`` and gate logits ``Z = x W_gate``;
entry ``b`` is ``norm(sum_j softmax_j(Z_j + B_j) * C_j)`` over the ``rate`` tokens of block
``b`` (``j`` the slot in the block, softmax per channel), rotated at the position of the
block's first token. With ``overlap`` each token carries two series: entry ``b`` pools the
first series of block ``b - 1`` and the second of block ``b`` (``2 * rate`` slots; the
previous block of block 0 is empty).

Tokens are placed by position, not by column, so left padding never enters a block and a
row's blocks start at its own position 0. A cached forward continues from the **tail**:
the projections of the block in progress and the one before it (``2 * rate`` slots),
which the layer keeps as a per-sequence state; which tail slots hold tokens follows from
the forward's first position, so a tail is never cleared.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn


@dataclass
class Blocks:
    """The blocks a forward touches, laid out ``(B, n, rate, channels)`` from block ``base`` on, one spare at the end."""

    values: Tensor  # (B, n, rate, 2 * width): [C | Z] of each slot (zeros where no token)
    filled: Tensor  # (B, n, rate) whether a token sits in the slot
    base: Tensor  # (B,) the absolute block index of block 0 (the block before the first position's)
    first: Tensor  # (B,) the forward's first real position (a large number for a row with none)
    last: Tensor  # (B,) its last real position (-1 for a row with none)


class BlockPooler(nn.Module):
    """One compressor: projections, slot bias and norm of the entries of width ``dim``."""

    def __init__(self, *, d_model: int, dim: int, rate: int, overlap: bool, make_norm: Callable[[int], nn.Module]) -> None:
        super().__init__()
        self.dim, self.rate, self.overlap = dim, rate, overlap
        self.series = 2 if overlap else 1
        self.kv = nn.Linear(d_model, self.series * dim, bias=False)
        self.gate = nn.Linear(d_model, self.series * dim, bias=False)
        self.slot_bias = nn.Parameter(torch.zeros(rate, self.series * dim))
        self.norm = make_norm(dim)

    @property
    def width(self) -> int:
        """Channels of the projected values (and of the gate logits) per token."""
        return self.series * self.dim

    @property
    def tail_shape(self) -> tuple[int, int]:
        """The per-sequence state a cache keeps for this pooler: two blocks of ``[C | Z]``."""
        return (2 * self.rate, 2 * self.width)

    def project(self, x: Tensor) -> Tensor:
        return torch.cat((self.kv(x), self.gate(x)), dim=-1)  # (B, T, 2 * width)

    def blocks(self, projected: Tensor, positions: Tensor, tail: Tensor | None) -> Blocks:
        """Place this forward's tokens (and the tail before them) into their blocks by position."""
        B, T, channels = projected.shape
        rate = self.rate
        real = positions >= 0
        big = torch.iinfo(torch.long).max // 4
        first = positions.masked_fill(~real, big).amin(dim=1)  # (B,)
        last = positions.max(dim=1).values.clamp(min=-1)  # (B,)
        has = real.any(dim=1)
        base = torch.where(has, torch.div(first, rate, rounding_mode="floor") - 1, torch.full_like(first, -1))
        # A row's positions run on one by one, so its tokens span at most (T - 1) // rate + 2 blocks after
        # ``base``; one spare block more, where the tail moves when the last token closes a block. Known
        # from the shapes alone: no device sync, and a compiled graph stays whole.
        n = (T - 1) // rate + 4
        values = projected.new_zeros((B, n * rate, channels))
        filled = torch.zeros((B, n * rate), dtype=torch.bool, device=projected.device)
        if tail is not None:
            slots = base[:, None] * rate + torch.arange(2 * rate, device=base.device)  # (B, 2*rate) absolute positions
            held = (slots >= 0) & (slots < first[:, None]) & has[:, None]
            values[:, : 2 * rate] = tail * held[..., None]
            filled[:, : 2 * rate] = held
        index = (positions - base[:, None] * rate).clamp(min=0)  # (B, T) slot of each token in the buffer
        index = torch.where(real, index, torch.full_like(index, n * rate - 1))
        values = values.scatter(1, index[..., None].expand(B, T, channels), projected * real[..., None])
        filled = filled.scatter(1, index, real) | filled
        return Blocks(values=values.view(B, n, rate, channels), filled=filled.view(B, n, rate),
                      base=base, first=first, last=last)

    def entries(self, blocks: Blocks, *, rotate: Callable[[Tensor, Tensor], Tensor]) -> tuple[Tensor, Tensor]:
        """Entries of blocks ``base + 1 ...`` ``(B, n - 1, dim)`` and their block indices ``(B, n - 1)``.

        ``rotate(x (B, 1, N, dim), positions (B, N))`` turns an entry at the position of its block's first token.
        """
        width, rate = self.width, self.rate
        values, gates = blocks.values[..., :width], blocks.values[..., width:]  # (B, n, rate, width) each
        gates = gates + self.slot_bias.to(gates.dtype)
        if self.overlap:
            dim = self.dim
            # Slots of entry j: the previous block's first series, then this block's second.
            values = torch.cat((values[:, :-1, :, :dim], values[:, 1:, :, dim:]), dim=2)  # (B, n-1, 2*rate, dim)
            gates = torch.cat((gates[:, :-1, :, :dim], gates[:, 1:, :, dim:]), dim=2)
            filled = torch.cat((blocks.filled[:, :-1], blocks.filled[:, 1:]), dim=2)  # (B, n-1, 2*rate)
        else:
            values, gates, filled = values[:, 1:], gates[:, 1:], blocks.filled[:, 1:]
        gates = gates.masked_fill(~filled[..., None], float("-inf"))
        # A block with no token yet is never read; a finite gate keeps its softmax (and gradient) free of NaN.
        gates = gates.masked_fill(~filled.any(dim=2)[..., None, None], 0.0)
        # In float32 at least (as transformers does): bfloat16 logits would merge close slots.
        weights = gates.softmax(dim=2, dtype=torch.promote_types(gates.dtype, torch.float32)).to(values.dtype)
        pooled = self.norm((values * weights).sum(dim=2))  # (B, n-1, dim)
        index = blocks.base[:, None] + torch.arange(1, values.shape[1] + 1, device=pooled.device)  # (B, n-1)
        return rotate(pooled[:, None], index * rate)[:, 0], index

    def tails(self, blocks: Blocks, upto: Tensor) -> Tensor:
        """The tail after the token at position ``upto`` ``(B, K)``: ``(B, K, 2*rate, 2*width)``."""
        B, n, rate, channels = blocks.values.shape
        start = torch.div(upto + 1, rate, rounding_mode="floor") - blocks.base[:, None] - 1  # (B, K) block of the tail
        start = start.clamp(0, n - 2)
        index = torch.stack((start, start + 1), dim=-1)  # (B, K, 2)
        picked = blocks.values.flatten(2).gather(1, index.flatten(1)[..., None].expand(-1, -1, rate * channels))
        return picked.view(B, -1, 2 * rate, channels)

