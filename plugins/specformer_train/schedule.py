"""Learning-rate schedules: a pure function of the step, so a resumed run needs only the step.

Every schedule starts with a linear warm-up, ``lr * (step + 1) / (warmup + 1)`` for
``step < warmup`` (as nanoGPT does: the first step is not at zero), then:

- ``warmup_cosine``: ``min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2``, where ``p`` goes
  from 0 to 1 between the end of warm-up and the last step;
- ``linear``: ``lr + (min_lr - lr) * p``;
- ``constant``: ``lr``;
- ``wsd`` (warmup-stable-decay, Hu et al. 2024 "MiniCPM"): ``lr`` until the last
  ``decay_fraction`` of the steps, then linear to ``min_lr``.
"""

from __future__ import annotations

import math
from typing import Callable

from specformer_train.config import TrainConfig


def learning_rate(step: int, *, schedule: str, lr: float, min_lr: float, warmup_steps: int, steps: int,
                  decay_fraction: float = 0.2) -> float:
    """The learning rate of optimizer step ``step`` (0-based) of ``steps``."""
    if step < warmup_steps:
        return lr * (step + 1) / (warmup_steps + 1)
    if schedule == "constant":
        return lr
    if schedule == "wsd":
        decay_start = max(warmup_steps, steps - int(round(decay_fraction * steps)))
        if step < decay_start:
            return lr
        progress = (step - decay_start) / max(1, steps - decay_start)
        return lr + (min_lr - lr) * min(1.0, progress)
    progress = min(1.0, (step - warmup_steps) / max(1, steps - warmup_steps))
    if schedule == "warmup_cosine":
        return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
    if schedule == "linear":
        return lr + (min_lr - lr) * progress
    raise ValueError(f"unknown schedule {schedule!r}; known: warmup_cosine, linear, constant, wsd")


def schedule_from_config(config: TrainConfig) -> Callable[[int], float]:
    def at(step: int) -> float:
        return learning_rate(step, schedule=config.schedule, lr=config.lr, min_lr=config.min_lr,
                             warmup_steps=config.warmup_steps, steps=config.steps,
                             decay_fraction=config.decay_fraction)

    return at
