"""``sgd``: stochastic gradient descent with (Nesterov) momentum, torch's implementation.

torch's SGD: with momentum ``mu`` and dampening 0, ``g <- g + weight_decay * p`` (L2, coupled),
``b <- mu * b + g`` (``b = g`` at the first step), the step direction is ``g + mu * b`` with
Nesterov, else ``b``; ``p <- p - lr * direction``. A baseline, and the simplest optimizer to
check a plugin's grouping rules against.
"""

from __future__ import annotations

import torch
from pydantic import Field, StrictBool
from torch import nn

from specformer.registry.params import Params
from specformer_train.config import Float, TrainConfig
from specformer_train.optimizers.adamw import decay_matrices
from specformer_train.optimizers.groups import GroupRule, build_groups


class SGDParams(Params):
    """Settings of ``sgd``; learning rate and weight decay (L2, matrices only) come from ``train:``."""

    momentum: Float = Field(default=0.9, ge=0, lt=1, description="Momentum (0: plain SGD).")
    nesterov: StrictBool = Field(default=False, description="Nesterov momentum (needs momentum > 0).")
    groups: list[GroupRule] = Field(
        default_factory=list, description="Rules that change the lr / weight decay of some parameters."
    )


def make_sgd(params: SGDParams, *, model: nn.Module, train: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """SGD with momentum (torch.optim.SGD, foreach); L2 weight decay on matrices only."""
    if params.nesterov and params.momentum == 0:
        raise ValueError("train.optimizer: nesterov: true needs momentum > 0")
    return torch.optim.SGD(build_groups(model, train, params.groups, decay_matrices(train)), lr=train.lr,
                           momentum=params.momentum, nesterov=params.nesterov, foreach=True)
