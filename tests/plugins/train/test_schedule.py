"""Learning-rate schedules against their formulas written out here."""

from __future__ import annotations

import math

import pytest

from specformer_train.config import TrainSpec
from specformer_train.schedule import learning_rate, step_learning_rates

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


def test_the_runs_rate_uses_the_config() -> None:
    config = TrainSpec(lr=2e-3, min_lr=0.0, warmup_steps=0, steps=10, schedule="linear")
    assert [round(step_learning_rates(s, config, [])[0], 6) for s in (0, 5, 10)] == [2e-3, 1e-3, 0.0]


@pytest.mark.parametrize("steps, warmup, fraction", [(100, 90, 0.2), (100, 80, 0.2), (50, 10, 0.9), (30, 29, 1.0)])
def test_wsd_never_decays_inside_the_warm_up(steps: int, warmup: int, fraction: float) -> None:
    # Written out: warm-up for s < w; after it, the decay starts at max(w, S - round(f * S)).
    lr, min_lr = 1.0, 0.1
    start = max(warmup, steps - round(fraction * steps))
    for step in range(steps + 1):
        if step < warmup:
            expected = lr * (step + 1) / (warmup + 1)
        else:
            expected = lr + (min_lr - lr) * min(1.0, (step - start) / max(1, steps - start))
        got = learning_rate(step, schedule="wsd", lr=lr, min_lr=min_lr, warmup_steps=warmup, steps=steps,
                            decay_fraction=fraction)
        assert got == pytest.approx(expected), step
    # The first step after a warm-up that reaches into the decay window is at the peak, not partly decayed.
    assert learning_rate(warmup, schedule="wsd", lr=lr, min_lr=min_lr, warmup_steps=warmup, steps=steps,
                         decay_fraction=fraction) == pytest.approx(lr)


def test_the_rates_of_a_step_evaluate_the_schedule_once_and_equal_each_groups_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import specformer_train.schedule as schedule

    calls: list[int] = []
    original = schedule.phase_of
    monkeypatch.setattr(schedule, "phase_of", lambda step, **kw: calls.append(step) or original(step, **kw))
    config = TrainSpec(lr=1e-3, min_lr=1e-4, warmup_steps=3, steps=20, schedule="wsd", decay_shape="1-sqrt")
    groups = [{"peak_lr": 1e-3, "min_lr": 1e-4}, {"peak_lr": 0.02, "min_lr": 0.002}, {"peak_lr": 5e-4, "min_lr": 0.0}]
    for step in (0, 2, 3, 10, 17, 19):
        calls.clear()
        lr, rates = schedule.step_learning_rates(step, config, groups)
        assert calls == [step]
        kw = dict(schedule="wsd", warmup_steps=3, steps=20, decay_fraction=0.2, decay_shape="1-sqrt")
        assert lr == original(step, **kw).at(1e-3, 1e-4) == rates[0]  # bit for bit
        assert rates == [learning_rate(step, lr=g["peak_lr"], min_lr=g["min_lr"], **kw) for g in groups]


PEAK, FLOOR = 1.0, 0.1  # round rates for the boundary cases below


@pytest.mark.parametrize("schedule", ["warmup_cosine", "linear", "wsd"])
def test_the_rate_stays_at_min_lr_after_the_last_step(schedule: str) -> None:
    # A run extended past `steps` (or a resumed run's extra steps) must not decay below min_lr.
    for step in (20, 21, 30, 60):
        got = learning_rate(step, schedule=schedule, lr=PEAK, min_lr=FLOOR, warmup_steps=2, steps=20)
        assert got == pytest.approx(FLOOR), step


@pytest.mark.parametrize("schedule", ["warmup_cosine", "linear", "wsd"])
def test_one_step_after_the_warm_up_reaches_min_lr(schedule: str) -> None:
    # steps = warmup + 1: the decay spans a single step, so step `steps` is fully decayed.
    kw = dict(schedule=schedule, lr=PEAK, min_lr=FLOOR, warmup_steps=4, steps=5, decay_fraction=1.0)
    assert learning_rate(4, **kw) == pytest.approx(PEAK)
    assert learning_rate(5, **kw) == pytest.approx(FLOOR)


def test_wsd_decays_over_the_last_fifth_by_default() -> None:
    # Default decay_fraction 0.2 of 100 steps: stable until step 80, then linear to min_lr at 100.
    kw = dict(schedule="wsd", lr=PEAK, min_lr=FLOOR, warmup_steps=0, steps=100)
    assert learning_rate(79, **kw) == PEAK
    assert learning_rate(90, **kw) == pytest.approx(PEAK + (FLOOR - PEAK) * 10 / 20)


def test_the_runs_rate_uses_the_decay_fraction() -> None:
    config = TrainSpec(lr=PEAK, min_lr=FLOOR, warmup_steps=0, steps=100, schedule="wsd", decay_fraction=0.5)

    def at(step: int) -> float:
        return step_learning_rates(step, config, [])[0]

    assert at(49) == PEAK
    assert at(75) == pytest.approx(PEAK + (FLOOR - PEAK) * 25 / 50)


def test_an_unknown_schedule_is_named_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown schedule 'cosine'.*warmup_cosine, linear, constant, wsd"):
        learning_rate(50, schedule="cosine", lr=PEAK, min_lr=FLOOR, warmup_steps=0, steps=100)


def test_the_runs_rate_uses_the_decay_shape() -> None:
    config = TrainSpec(lr=PEAK, min_lr=FLOOR, warmup_steps=0, steps=100, schedule="wsd", decay_fraction=0.5,
                         decay_shape="cosine")
    # A fifth into the decay (step 60 of 50..100); halfway, cosine and linear would agree.
    cosine = FLOOR + (PEAK - FLOOR) * 0.5 * (1 + math.cos(math.pi * 0.2))
    assert cosine != pytest.approx(PEAK + (FLOOR - PEAK) * 0.2)
    assert step_learning_rates(60, config, [])[0] == pytest.approx(cosine)


def test_group_rates_use_the_runs_decay_fraction() -> None:
    config = TrainSpec(lr=PEAK, min_lr=FLOOR, warmup_steps=0, steps=100, schedule="wsd", decay_fraction=0.5)
    groups = [{"peak_lr": 2.0, "min_lr": 0.0}, {"peak_lr": PEAK, "min_lr": FLOOR}]
    # Step 75: halfway through a decay that starts at step 50 (not at 80, the default fraction's start).
    assert step_learning_rates(75, config, groups)[1] == pytest.approx([1.0, PEAK + (FLOOR - PEAK) * 0.5])
