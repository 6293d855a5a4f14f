"""The run's optimizer: the ``train.optimizer`` component, built over the model's parameter groups.

The optimizers themselves are components of the ``optimizer`` kind
(:mod:`specformer_train.optimizers`); this module builds the one a config names and keeps
the historical helper :func:`param_groups` (AdamW's two default groups).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from specformer.errors import UserError
from specformer_train.config import TrainSpec


def param_groups(model: nn.Module, *, weight_decay: float) -> list[dict]:
    """Two AdamW groups: ``>= 2``-D trainable parameters with ``weight_decay``, the rest without."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.dim() >= 2 else no_decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def optimizer_name(config: TrainSpec) -> str:
    """The registered name of the config's optimizer (``adamw``, ``muon``, ...)."""
    return config.optimizer.component.name


def make_optimizer(model: nn.Module, config: TrainSpec, *, device: torch.device) -> torch.optim.Optimizer:
    """The optimizer ``config.optimizer`` names, over ``model``'s parameters; a bad rule is a :class:`UserError`."""
    try:
        # The optimizer gets its own params and the run's settings it may use, never the whole config.
        optimizer = config.optimizer.make(model=model, lr=config.lr, min_lr=config.min_lr,
                                          weight_decay=config.weight_decay, betas=config.betas, eps=config.eps,
                                          device=device)
    except ValueError as exc:  # a group rule matching nothing, an impossible combination of settings
        raise UserError(str(exc)) from None
    for group in optimizer.param_groups:
        if "peak_lr" not in group or "min_lr" not in group:
            raise UserError(f"optimizer {optimizer_name(config)!r} built param groups without peak_lr and min_lr; "
                            "build them with specformer_train.optimizers.groups.build_groups")
    return optimizer


def group_settings(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Every group's settings except its parameters (what a resumed run re-applies over the saved ones)."""
    return [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
