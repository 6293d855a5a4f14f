"""The bias of a tied LM head: its own parameter beside the embedding table the head shares (CTRL).

An untied head is an ``nn.Linear`` holding its bias. A tied head has no module of its own
(the logits are the embedding table times the stream), so its bias lives here, one entry
per embedding row, added after the matmul; a quantized copy of the tied head (the quant
plugin's ``lm_head``) leaves it as it is.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from specformer.model.parallel_plan import ParallelPlan


class TiedHeadBias(nn.Module):
    """``logits + bias``: a learned bias per vocabulary row (padded rows included), initialised to zero."""

    def __init__(self, *, rows: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(rows))

    def parallel_plan(self) -> ParallelPlan:
        """Whole on every device: a tied head is never split by vocabulary (its logits are whole)."""
        return {}

    def init_weights(self, *, std: float, residual_std: float) -> None:
        nn.init.zeros_(self.bias)

    def forward(self, logits: Tensor) -> Tensor:
        return logits + self.bias

    def extra_repr(self) -> str:
        return f"rows={self.bias.numel()}"
