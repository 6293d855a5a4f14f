"""``adamw``: AdamW (Loshchilov & Hutter 2019) with decoupled weight decay, torch's implementation.

By default matrices (embeddings, head, hidden projections) decay by ``train.weight_decay``
and vectors (norm scales, biases) do not: shrinking a norm's gain or a bias towards zero is
not regularisation but a bias of its own (GPT-2 / nanoGPT / Llama training). On CUDA the
fused kernel updates all parameters in a few launches; elsewhere the foreach path. With
no ``groups`` rules this is exactly the optimizer specformer always trained with.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from specformer_train.optimizers.groups import build_groups
from specformer_train.optimizers.params import AdamWParams


def decay_matrices(*, lr: float, weight_decay: float) -> Any:
    """Default settings of a role: the run's lr, ``weight_decay`` on matrices and none on vectors."""

    def defaults(role: str, name: str, param: nn.Parameter) -> dict[str, Any]:
        return {"lr": lr, "weight_decay": 0.0 if role == "vector" else weight_decay}

    return defaults


def make_adamw(params: AdamWParams, *, model: nn.Module, lr: float, min_lr: float, weight_decay: float,
               betas: tuple[float, float], eps: float, device: torch.device) -> torch.optim.Optimizer:
    """AdamW over ``model``'s groups; ``betas`` and ``eps`` are the run's, which ``params`` may override."""
    fused = device.type == "cuda" if params.fused == "auto" else params.fused
    return torch.optim.AdamW(
        build_groups(model, params.groups, decay_matrices(lr=lr, weight_decay=weight_decay), lr=lr, min_lr=min_lr),
        lr=lr,
        betas=tuple(params.betas or betas),
        eps=params.eps or eps,
        fused=fused or None,
        foreach=None if fused else True,
    )
