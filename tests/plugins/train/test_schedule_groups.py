"""warmup_stable_decay's decay shapes (formulas written here) and the schedule applied per param group."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

import specformer
from specformer.errors import SpecError
from specformer.registry.discovery import get_registry
from specformer.tokenizers.tokenizer import ByteTokenizer
from specformer.spec.validate import validate
from specformer_train.config import TrainSpec
from specformer_train.data import PackedRows
from specformer_train.schedule import learning_rate, step_learning_rates
from specformer_train.trainer import Trainer

from .conftest import tiny_train_spec

LR, MIN, STEPS, WARMUP = 1.0, 0.1, 100, 10


def wsd(step: int, shape: str) -> float:
    return learning_rate(step, schedule="wsd", lr=LR, min_lr=MIN, warmup_steps=WARMUP, steps=STEPS,
                         decay_fraction=0.4, decay_shape=shape)


@pytest.mark.parametrize("shape, formula", [
    ("linear", lambda p: LR + (MIN - LR) * p),
    ("cosine", lambda p: MIN + (LR - MIN) * (1 + math.cos(math.pi * p)) / 2),
    ("1-sqrt", lambda p: MIN + (LR - MIN) * (1 - math.sqrt(p))),
])
def test_wsd_decay_shapes_follow_their_formulas(shape: str, formula) -> None:
    # decay over the last 40 of 100 steps: p = (step - 60) / 40
    for step in range(WARMUP, 60):
        assert wsd(step, shape) == LR, step  # stable
    for step in range(60, STEPS + 5):
        assert wsd(step, shape) == pytest.approx(formula(min(1.0, (step - 60) / 40)), abs=1e-12), step
    for step in range(WARMUP):  # the warm-up is the same for every shape
        assert wsd(step, shape) == pytest.approx(LR * (step + 1) / (WARMUP + 1))


def test_the_shapes_differ_where_they_should() -> None:
    quarter = 60 + 10  # p = 1/4
    assert wsd(quarter, "linear") == pytest.approx(1 - 0.9 / 4)
    assert wsd(quarter, "1-sqrt") == pytest.approx(0.1 + 0.9 * 0.5)  # 1-sqrt drops fastest at first
    assert wsd(quarter, "1-sqrt") < wsd(quarter, "linear") < wsd(quarter, "cosine")


def test_an_unknown_decay_shape_is_a_spec_error() -> None:
    spec = tiny_train_spec(schedule="wsd", decay_shape="sqrt")
    with pytest.raises(SpecError, match="decay_shape"):
        validate(spec, registry=get_registry())
    with pytest.raises(ValueError, match="known: linear, cosine, 1-sqrt"):
        learning_rate(90, schedule="wsd", lr=1, min_lr=0, warmup_steps=0, steps=100, decay_shape="sqrt")


def test_each_group_follows_the_schedule_between_its_own_peak_and_min() -> None:
    config = TrainSpec(lr=1e-3, min_lr=1e-4, warmup_steps=5, steps=50, schedule="wsd", decay_shape="cosine")
    groups = [{"peak_lr": 1e-3, "min_lr": 1e-4}, {"peak_lr": 0.02, "min_lr": 0.002}, {"peak_lr": 0.5, "min_lr": 0.0}]
    for step in (0, 3, 5, 20, 41, 45, 49, 50):
        got = step_learning_rates(step, config, groups)[1]
        assert got[0] == learning_rate(step, schedule="wsd", lr=1e-3, min_lr=1e-4, warmup_steps=5, steps=50,
                                       decay_shape="cosine")
        assert got[1] == pytest.approx(got[0] * 20)  # min_lr scaled like the peak: the same curve, 20x
        assert got[2] == learning_rate(step, schedule="wsd", lr=0.5, min_lr=0.0, warmup_steps=5, steps=50,
                                       decay_shape="cosine")


def test_the_trainer_steps_each_group_at_its_own_rate(tmp_path: Path) -> None:
    spec = tiny_train_spec(steps=3, warmup_steps=1, schedule="linear", lr=1e-3, min_lr=0.0,
                           optimizer={"kind": "muon", "lr": 0.05, "groups": [{"match": ["vector"], "lr": 2e-3}]})
    config = TrainSpec(**spec["train"])
    rows = PackedRows(np.random.default_rng(0).integers(0, 256, size=4000), seq_len=32, seed=0)
    trainer = Trainer(model=specformer.build(spec, seed=0), config=config, train_rows=rows, val_rows=None,
                      tokenizer=ByteTokenizer(), out_dir=tmp_path, device="cpu")
    seen: list[dict[str, float]] = []
    step = trainer.optimizer.step

    def spy(*args, **kwargs):
        seen.append({g["role"]: g["lr"] for g in trainer.optimizer.param_groups})
        return step(*args, **kwargs)

    trainer.optimizer.step = spy
    trainer.fit()
    assert len(seen) == 3
    for index, lrs in enumerate(seen):
        def at(peak: float) -> float:
            return learning_rate(index, schedule="linear", lr=peak, min_lr=0.0, warmup_steps=1, steps=3)
        assert lrs == {"embedding": at(1e-3), "vector": at(2e-3), "matrix": at(0.05)}
    assert seen[0]["matrix"] == pytest.approx(0.025) and seen[2]["matrix"] == pytest.approx(0.05 * 0.5)
    torch.testing.assert_close(torch.tensor(seen[1]["vector"]), torch.tensor(2e-3))
