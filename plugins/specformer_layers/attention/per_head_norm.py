"""A norm with its own weights for every head: ``qk_norm_scope: per_head_weights`` (StableLM 2 12B)."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class PerHeadNorm(nn.ModuleList):
    """One norm module per head, each applied to its own head's channels.

    ``qk_norm_scope: head`` shares one norm (one weight vector) across the heads;
    StableLM 2's q/k LayerNorms (``qk_layernorm``) learn a separate one for each head.
    Any norm component works here, since each head's slice goes through an ordinary norm
    of ``head_dim`` channels. Parameters are named ``{h}.weight`` (and ``{h}.bias``), h
    the head, as transformers' ``norms.{h}.weight``.
    """

    def __init__(self, norms: list[nn.Module]) -> None:
        if not norms:
            raise ValueError("PerHeadNorm needs one norm per head, got none")
        super().__init__(norms)

    def forward(self, x: Tensor) -> Tensor:
        # x: (B, H, T, hd); head h goes through norm h. A loop of H small calls: the
        # norms may be any registered kind, so their weights cannot be stacked in general.
        if x.shape[1] != len(self):
            raise ValueError(f"PerHeadNorm holds {len(self)} heads' norms, got {x.shape[1]} heads")
        return torch.cat([norm(head) for norm, head in zip(self, x.split(1, dim=1))], dim=1)  # (B, H, T, hd)
