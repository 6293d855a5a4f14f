"""``lion``: the sign of an interpolated momentum (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms").

For each parameter, with momentum ``m`` (zero at first) and gradient ``g``::

    p <- p * (1 - lr * weight_decay) - lr * sign(beta1 * m + (1 - beta1) * g)
    m <- beta2 * m + (1 - beta2) * g

Every coordinate moves by exactly ``lr`` per step, so Lion wants a learning rate 3-10x smaller
than AdamW's and a correspondingly larger weight decay (the paper's advice). One state tensor
per parameter (``exp_avg``) instead of AdamW's two.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from specformer_train.optimizers.adamw import decay_matrices
from specformer_train.optimizers.groups import build_groups
from specformer_train.optimizers.params import LionParams


class Lion(torch.optim.Optimizer):
    """Lion with decoupled weight decay."""

    def __init__(self, groups: list[dict[str, Any]], *, lr: float, betas: tuple[float, float]) -> None:
        for beta in betas:
            if not 0 <= beta < 1:
                raise ValueError(f"Lion's betas must each be in [0, 1), got {list(betas)}")
        super().__init__(groups, dict(lr=lr, betas=betas, weight_decay=0.0))

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, wd = group["lr"], group["weight_decay"]
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "exp_avg" not in state:
                    state["exp_avg"] = torch.zeros_like(p)
                exp_avg = state["exp_avg"]
                update = exp_avg.lerp(p.grad, 1 - beta1).sign_()
                p.mul_(1 - lr * wd)
                p.add_(update, alpha=-lr)
                exp_avg.lerp_(p.grad, 1 - beta2)
        return loss


def make_lion(params: LionParams, *, model: nn.Module, lr: float, min_lr: float,
              weight_decay: float) -> torch.optim.Optimizer:
    """Lion over ``model``'s groups at the run's ``lr``, decoupled ``weight_decay`` on matrices only."""
    groups = build_groups(model, params.groups, decay_matrices(lr=lr, weight_decay=weight_decay), lr=lr, min_lr=min_lr)
    return Lion(groups, lr=lr, betas=tuple(params.betas))
