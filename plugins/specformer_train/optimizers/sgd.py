"""``sgd``: stochastic gradient descent with (Nesterov) momentum, torch's implementation.

torch's SGD: with momentum ``mu`` and dampening 0, ``g <- g + weight_decay * p`` (L2, coupled),
``b <- mu * b + g`` (``b = g`` at the first step), the step direction is ``g + mu * b`` with
Nesterov, else ``b``; ``p <- p - lr * direction``. A baseline, and the simplest optimizer to
check a plugin's grouping rules against.
"""

from __future__ import annotations

import torch
from torch import nn

from specformer_train.optimizers.adamw import decay_matrices
from specformer_train.optimizers.groups import build_groups
from specformer_train.optimizers.params import SGDParams


def make_sgd(params: SGDParams, *, model: nn.Module, lr: float, min_lr: float,
             weight_decay: float) -> torch.optim.Optimizer:
    """SGD over ``model``'s groups at the run's ``lr``; L2 ``weight_decay`` on matrices only."""
    if params.nesterov and params.momentum == 0:
        raise ValueError("train.optimizer: nesterov: true needs momentum > 0")
    groups = build_groups(model, params.groups, decay_matrices(lr=lr, weight_decay=weight_decay), lr=lr, min_lr=min_lr)
    return torch.optim.SGD(groups, lr=lr, momentum=params.momentum, nesterov=params.nesterov, foreach=True)
