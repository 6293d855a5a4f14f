"""When a row is finished: it produced an end-of-sequence id or ended with a stop sequence.

Tracked on the device (``done``, ``finished_at``) so the decode loop needs no host sync
per token; the loop reads ``all_done()`` only every few tokens.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor


class StopCondition:
    """Per-row finished flags for a batch, updated with each new column of tokens."""

    def __init__(
        self,
        *,
        batch_size: int,
        eos: Sequence[int] = (),
        stop: Sequence[Sequence[int]] = (),
        device: torch.device | str | None = None,
    ) -> None:
        self.eos = torch.tensor(list(eos), dtype=torch.long, device=device)
        self.stop = [torch.tensor(list(s), dtype=torch.long, device=device) for s in stop]
        for i, s in enumerate(self.stop):
            if s.numel() == 0:
                raise ValueError(f"stop[{i}] is an empty sequence; every stop sequence needs at least one token")
        self.active = bool(eos) or bool(stop)
        self.done = torch.zeros(batch_size, dtype=torch.bool, device=device)
        # The step at which each row finished (its last token included); a large value while running.
        self.finished_at = torch.full((batch_size,), torch.iinfo(torch.long).max, dtype=torch.long, device=device)

    def hits(self, tokens: Tensor, column: int) -> Tensor:
        """``(B,)`` True where the sequence ending at ``column`` of ``tokens`` ``(B, W)`` ends a row."""
        token = tokens[:, column]
        hit = torch.isin(token, self.eos) if self.eos.numel() else torch.zeros_like(token, dtype=torch.bool)
        for seq in self.stop:
            n = seq.numel()
            if column + 1 >= n:
                hit |= (tokens[:, column + 1 - n : column + 1] == seq).all(dim=-1)
        return hit

    def update(self, tokens: Tensor, column: int, step: int) -> None:
        """Record rows that finish with the token written at ``column`` (generated at ``step``)."""
        if not self.active:
            return
        newly = self.hits(tokens, column) & ~self.done
        self.finished_at = torch.where(newly, step, self.finished_at)
        self.done |= newly

    def all_done(self) -> bool:
        """Whether every row finished (reads the device: call it sparingly)."""
        return self.active and bool(self.done.all())
