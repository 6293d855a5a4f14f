"""Learning-rate schedules: a pure function of the step, so a resumed run needs only the step.

Every schedule starts with a linear warm-up, ``lr * (step + 1) / (warmup + 1)`` for
``step < warmup`` (as nanoGPT does: the first step is not at zero), then:

- ``warmup_cosine``: ``min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2``, where ``p`` goes
  from 0 to 1 between the end of warm-up and the last step;
- ``linear``: ``lr + (min_lr - lr) * p``;
- ``constant``: ``lr``;
- ``wsd`` (warmup-stable-decay, Hu et al. 2024 "MiniCPM"): ``lr`` until the last
  ``decay_fraction`` of the steps, then down to ``min_lr`` with ``p`` going from 0 to 1 over
  the decay, in one of three shapes (``decay_shape``):
  ``linear``: ``lr + (min_lr - lr) * p``;
  ``cosine``: ``min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2``;
  ``1-sqrt`` (Hägele et al. 2024, "Scaling Laws and Compute-Optimal Training Beyond Fixed
  Training Durations"): ``min_lr + (lr - min_lr) * (1 - sqrt(p))``.

The schedule applies to each param group on its own: a group's ``peak_lr`` and ``min_lr``
(see :mod:`specformer_train.optimizers.groups`) take the place of ``lr`` and ``min_lr``, with
the run's warm-up, length and shape; a group at ``train.lr`` follows exactly the run's schedule.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from specformer_train.config import TrainConfig


def learning_rate(step: int, *, schedule: str, lr: float, min_lr: float, warmup_steps: int, steps: int,
                  decay_fraction: float = 0.2, decay_shape: str = "linear") -> float:
    """The learning rate of optimizer step ``step`` (0-based) of ``steps``."""
    if step < warmup_steps:
        return lr * (step + 1) / (warmup_steps + 1)
    if schedule == "constant":
        return lr
    if schedule == "wsd":
        decay_start = max(warmup_steps, steps - int(round(decay_fraction * steps)))
        if step < decay_start:
            return lr
        progress = min(1.0, (step - decay_start) / max(1, steps - decay_start))
        if decay_shape == "linear":
            return lr + (min_lr - lr) * progress
        if decay_shape == "cosine":
            return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
        if decay_shape == "1-sqrt":
            return min_lr + (lr - min_lr) * (1.0 - math.sqrt(progress))
        raise ValueError(f"unknown decay_shape {decay_shape!r}; known: linear, cosine, 1-sqrt")
    progress = min(1.0, (step - warmup_steps) / max(1, steps - warmup_steps))
    if schedule == "warmup_cosine":
        return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
    if schedule == "linear":
        return lr + (min_lr - lr) * progress
    raise ValueError(f"unknown schedule {schedule!r}; known: warmup_cosine, linear, constant, wsd")


def schedule_from_config(config: TrainConfig) -> Callable[[int], float]:
    """The run's schedule at ``train.lr``: what is logged as ``lr``."""
    def at(step: int) -> float:
        return learning_rate(step, schedule=config.schedule, lr=config.lr, min_lr=config.min_lr,
                             warmup_steps=config.warmup_steps, steps=config.steps,
                             decay_fraction=config.decay_fraction, decay_shape=config.decay_shape)

    return at


def group_learning_rates(step: int, config: TrainConfig, groups: list[dict[str, Any]]) -> list[float]:
    """Each param group's learning rate at ``step``: the run's schedule between its ``peak_lr`` and ``min_lr``."""
    return [learning_rate(step, schedule=config.schedule, lr=group["peak_lr"], min_lr=group["min_lr"],
                          warmup_steps=config.warmup_steps, steps=config.steps,
                          decay_fraction=config.decay_fraction, decay_shape=config.decay_shape)
            for group in groups]
