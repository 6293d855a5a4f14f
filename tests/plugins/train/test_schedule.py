"""Learning-rate schedules against their formulas written out here."""

from __future__ import annotations

import math

import pytest

from specformer_train.config import TrainConfig
from specformer_train.schedule import learning_rate, schedule_from_config

LR, MIN, WARM, STEPS = 1e-3, 1e-4, 10, 110


def lr_of(schedule: str, step: int, **kw: float) -> float:
    return learning_rate(step, schedule=schedule, lr=LR, min_lr=MIN, warmup_steps=WARM, steps=STEPS, **kw)


@pytest.mark.parametrize("schedule", ["warmup_cosine", "linear", "constant", "wsd"])
def test_warmup_is_linear_and_never_zero(schedule: str) -> None:
    for step in range(WARM):
        assert lr_of(schedule, step) == pytest.approx(LR * (step + 1) / (WARM + 1))
    assert lr_of(schedule, 0) > 0


def test_cosine_matches_the_formula() -> None:
    for step in range(WARM, STEPS):
        p = (step - WARM) / (STEPS - WARM)
        expected = MIN + 0.5 * (LR - MIN) * (1 + math.cos(math.pi * p))
        assert lr_of("warmup_cosine", step) == pytest.approx(expected)
    assert lr_of("warmup_cosine", WARM) == pytest.approx(LR)
    assert lr_of("warmup_cosine", STEPS) == pytest.approx(MIN)


def test_linear_and_constant() -> None:
    for step in range(WARM, STEPS):
        p = (step - WARM) / (STEPS - WARM)
        assert lr_of("linear", step) == pytest.approx(LR - (LR - MIN) * p)
        assert lr_of("constant", step) == LR


def test_wsd_is_stable_then_decays_over_the_last_fraction() -> None:
    decay_start = STEPS - round(0.2 * STEPS)  # 88
    for step in range(WARM, decay_start):
        assert lr_of("wsd", step, decay_fraction=0.2) == LR
    for step in range(decay_start, STEPS + 1):
        p = (step - decay_start) / (STEPS - decay_start)
        assert lr_of("wsd", step, decay_fraction=0.2) == pytest.approx(LR + (MIN - LR) * p)


def test_warmup_longer_than_the_run_only_warms_up() -> None:
    assert learning_rate(4, schedule="warmup_cosine", lr=1.0, min_lr=0.0, warmup_steps=100, steps=5) == pytest.approx(5 / 101)


def test_schedule_from_config_uses_the_config() -> None:
    config = TrainConfig(lr=2e-3, min_lr=0.0, warmup_steps=0, steps=10, schedule="linear")
    at = schedule_from_config(config)
    assert [round(at(s), 6) for s in (0, 5, 10)] == [2e-3, 1e-3, 0.0]
