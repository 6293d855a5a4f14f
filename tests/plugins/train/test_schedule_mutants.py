"""Schedule behaviour the mutation run (benchmarks/mutation.py) found unpinned; formulas written here."""

from __future__ import annotations

import math

import pytest

from specformer_train.config import TrainConfig
from specformer_train.schedule import learning_rate, step_learning_rates

LR, MIN = 1.0, 0.1


@pytest.mark.parametrize("schedule", ["warmup_cosine", "linear", "wsd"])
def test_the_rate_stays_at_min_lr_after_the_last_step(schedule: str) -> None:
    # A run extended past `steps` (or a resumed run's extra steps) must not decay below min_lr.
    for step in (20, 21, 30, 60):
        got = learning_rate(step, schedule=schedule, lr=LR, min_lr=MIN, warmup_steps=2, steps=20)
        assert got == pytest.approx(MIN), step


@pytest.mark.parametrize("schedule", ["warmup_cosine", "linear", "wsd"])
def test_one_step_after_the_warm_up_reaches_min_lr(schedule: str) -> None:
    # steps = warmup + 1: the decay spans a single step, so step `steps` is fully decayed.
    kw = dict(schedule=schedule, lr=LR, min_lr=MIN, warmup_steps=4, steps=5, decay_fraction=1.0)
    assert learning_rate(4, **kw) == pytest.approx(LR)
    assert learning_rate(5, **kw) == pytest.approx(MIN)


def test_wsd_decays_over_the_last_fifth_by_default() -> None:
    # Default decay_fraction 0.2 of 100 steps: stable until step 80, then linear to min_lr at 100.
    kw = dict(schedule="wsd", lr=LR, min_lr=MIN, warmup_steps=0, steps=100)
    assert learning_rate(79, **kw) == LR
    assert learning_rate(90, **kw) == pytest.approx(LR + (MIN - LR) * 10 / 20)


def test_the_runs_rate_uses_the_decay_fraction() -> None:
    config = TrainConfig(lr=LR, min_lr=MIN, warmup_steps=0, steps=100, schedule="wsd", decay_fraction=0.5)

    def at(step: int) -> float:
        return step_learning_rates(step, config, [])[0]
    assert at(49) == LR
    assert at(75) == pytest.approx(LR + (MIN - LR) * 25 / 50)


def test_warmup_cosine_halfway_is_the_mean_of_lr_and_min_lr() -> None:
    at = learning_rate(15, schedule="warmup_cosine", lr=LR, min_lr=MIN, warmup_steps=10, steps=20)
    assert at == pytest.approx(MIN + (LR - MIN) * 0.5 * (1 + math.cos(math.pi * 0.5)))


def test_an_unknown_schedule_is_named_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown schedule 'cosine'.*warmup_cosine, linear, constant, wsd"):
        learning_rate(50, schedule="cosine", lr=LR, min_lr=MIN, warmup_steps=0, steps=100)


def test_the_runs_rate_uses_the_decay_shape() -> None:
    config = TrainConfig(lr=LR, min_lr=MIN, warmup_steps=0, steps=100, schedule="wsd", decay_fraction=0.5,
                         decay_shape="cosine")
    # A fifth into the decay (step 60 of 50..100); halfway, cosine and linear would agree.
    cosine = MIN + (LR - MIN) * 0.5 * (1 + math.cos(math.pi * 0.2))
    assert cosine != pytest.approx(LR + (MIN - LR) * 0.2)
    assert step_learning_rates(60, config, [])[0] == pytest.approx(cosine)


def test_group_rates_use_the_runs_decay_fraction() -> None:
    config = TrainConfig(lr=LR, min_lr=MIN, warmup_steps=0, steps=100, schedule="wsd", decay_fraction=0.5)
    groups = [{"peak_lr": 2.0, "min_lr": 0.0}, {"peak_lr": LR, "min_lr": MIN}]
    # Step 75: halfway through a decay that starts at step 50 (not at 80, the default fraction's start).
    assert step_learning_rates(75, config, groups)[1] == pytest.approx([1.0, LR + (MIN - LR) * 0.5])
