"""The grouped low-rank output projection (DeepSeek-V4): heads in groups, each group narrowed, then mixed."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class GroupedLowRankOutput(nn.Module):
    """``(B, T, in_features)`` -> ``(B, T, d_model)`` through ``groups`` separate ``in/groups -> rank`` maps, then one mix.

    A direct map from every head's output to ``d_model`` is the largest matrix of an
    attention with many wide heads; splitting the heads into groups, each projected to
    ``rank`` channels (a block-diagonal matrix), and mixing the ``groups * rank`` channels
    to ``d_model`` costs ``in * rank + groups * rank * d_model`` weights instead of
    ``in * d_model``. ``down`` is stored as the rows of every group one after the other,
    ``(groups * rank, in / groups)``, as DeepSeek-V4's ``o_a_proj`` is.
    """

    def __init__(self, *, in_features: int, groups: int, rank: int, d_model: int) -> None:
        super().__init__()
        if in_features % groups:
            raise ValueError(f"out_groups ({groups}) must divide the attention output's {in_features} channels")
        self.groups, self.rank = groups, rank
        self.down = nn.Parameter(torch.empty(groups * rank, in_features // groups))
        nn.init.kaiming_uniform_(self.down, a=math.sqrt(5))  # as nn.Linear starts
        self.mix = nn.Linear(groups * rank, d_model, bias=False)

    def forward(self, y: Tensor) -> Tensor:
        y = y.unflatten(-1, (self.groups, -1))  # (B, T, groups, in/groups)
        down = self.down.view(self.groups, self.rank, -1)  # (groups, rank, in/groups)
        narrowed = torch.einsum("btgi,gri->btgr", y, down)  # (B, T, groups, rank)
        return self.mix(narrowed.flatten(-2))

    def init_weights(self, *, std: float, residual_std: float) -> None:
        nn.init.normal_(self.down, std=std)
        nn.init.normal_(self.mix.weight, std=residual_std)  # feeds the residual stream

    def extra_repr(self) -> str:
        return f"groups={self.groups}, rank={self.rank}"
