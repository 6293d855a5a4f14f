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
from dataclasses import dataclass
from typing import Any

from specformer_train.config import TrainSpec


@dataclass(frozen=True)
class Phase:
    """Where one step lies in the schedule, worked out once; :meth:`at` gives it for any ``(lr, min_lr)``.

    ``kind`` is ``warmup`` (step ``done`` of ``total``, both counted from 1), ``peak`` (the
    learning rate itself) or ``decay`` (``progress`` from 0 to 1 along ``shape``).
    """

    kind: str
    shape: str = "linear"
    done: int = 0
    total: int = 1
    progress: float = 0.0

    def at(self, lr: float, min_lr: float) -> float:
        """The learning rate of a group that peaks at ``lr`` and decays to ``min_lr``, at this phase."""
        if self.kind == "warmup":
            return lr * self.done / self.total
        if self.kind == "peak":
            return lr
        if self.shape == "linear":
            return lr + (min_lr - lr) * self.progress
        if self.shape == "cosine":
            return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * self.progress))
        return min_lr + (lr - min_lr) * (1.0 - math.sqrt(self.progress))  # 1-sqrt


def phase_of(step: int, *, schedule: str, warmup_steps: int, steps: int, decay_fraction: float = 0.2,
             decay_shape: str = "linear") -> Phase:
    """The phase of optimizer step ``step`` (0-based) of ``steps``."""
    if step < warmup_steps:
        return Phase("warmup", done=step + 1, total=warmup_steps + 1)
    if schedule == "constant":
        return Phase("peak")
    if schedule == "wsd":
        if decay_shape not in ("linear", "cosine", "1-sqrt"):
            raise ValueError(f"unknown decay_shape {decay_shape!r}; known: linear, cosine, 1-sqrt")
        decay_start = max(warmup_steps, steps - int(round(decay_fraction * steps)))
        if step < decay_start:
            return Phase("peak")
        return Phase("decay", shape=decay_shape, progress=min(1.0, (step - decay_start) / max(1, steps - decay_start)))
    progress = min(1.0, (step - warmup_steps) / max(1, steps - warmup_steps))
    if schedule == "warmup_cosine":
        return Phase("decay", shape="cosine", progress=progress)
    if schedule == "linear":
        return Phase("decay", shape="linear", progress=progress)
    raise ValueError(f"unknown schedule {schedule!r}; known: warmup_cosine, linear, constant, wsd")


def learning_rate(step: int, *, schedule: str, lr: float, min_lr: float, warmup_steps: int, steps: int,
                  decay_fraction: float = 0.2, decay_shape: str = "linear") -> float:
    """The learning rate of optimizer step ``step`` (0-based) of ``steps``."""
    return phase_of(step, schedule=schedule, warmup_steps=warmup_steps, steps=steps, decay_fraction=decay_fraction,
                    decay_shape=decay_shape).at(lr, min_lr)


def step_learning_rates(step: int, config: TrainSpec, groups: list[dict[str, Any]]) -> tuple[float, list[float]]:
    """The run's learning rate at ``step`` (at ``train.lr``: what is logged) and each param group's.

    The schedule is evaluated once for the step; each group's rate is that phase between its
    ``peak_lr`` and ``min_lr``.
    """
    phase = phase_of(step, schedule=config.schedule, warmup_steps=config.warmup_steps, steps=config.steps,
                     decay_fraction=config.decay_fraction, decay_shape=config.decay_shape)
    return phase.at(config.lr, config.min_lr), [phase.at(group["peak_lr"], group["min_lr"]) for group in groups]
