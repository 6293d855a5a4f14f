"""What the optimizer actually steps with, pinned against hand computations: the clipped gradient,
accumulated micro-batches, the settings of a resumed run, and the evaluation loss."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import specformer
from specformer.tokenizers.tokenizer import ByteTokenizer
from specformer_train import train
from specformer_train.config import TrainSpec
from specformer_train.data import EvalRows, PackedRows
from specformer_train.schedule import learning_rate
from specformer_train.trainer import Trainer

from .conftest import TINY_TRAIN, tiny_train_spec


def make_trainer(tmp_path: Path, *, tokens: np.ndarray | None = None, val: np.ndarray | None = None,
                 **settings: Any) -> Trainer:
    spec = tiny_train_spec(**settings)
    config = TrainSpec(**spec["train"])
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 256, size=4000) if tokens is None else tokens
    model = specformer.build(spec, seed=0)
    return Trainer(model=model, config=config, train_rows=PackedRows(tokens, seq_len=32, seed=0),
                   val_rows=None if val is None else EvalRows(val, seq_len=32), tokenizer=ByteTokenizer(),
                   out_dir=tmp_path, device="cpu")


class StepSpy:
    """Wraps ``optimizer.step`` to record the gradients and param groups it is called with."""

    def __init__(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> None:
        self.grads: list[dict[str, torch.Tensor]] = []
        self.groups: list[list[dict[str, Any]]] = []
        step = optimizer.step

        def spy(*args: Any, **kwargs: Any) -> Any:
            self.grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
            self.groups.append([{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups])
            return step(*args, **kwargs)

        optimizer.step = spy


def global_norm(grads: dict[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float(g.double().square().sum()) for g in grads.values()))


def whole_batch_grads(model: torch.nn.Module, rows: np.ndarray) -> dict[str, torch.Tensor]:
    """The reference: mean cross-entropy over every target token of ``rows``, one backward pass."""
    model = copy.deepcopy(model)
    batch = torch.from_numpy(rows)
    logits = model(batch[:, :-1])  # (B, T, vocab)
    F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten()).backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("clip", [0.05, None])
def test_the_optimizer_steps_with_the_clipped_gradient(tmp_path: Path, clip: float | None) -> None:
    trainer = make_trainer(tmp_path, grad_clip=clip, steps=2)
    reference = whole_batch_grads(trainer.model, trainer.train_rows.rows(0, 4))
    raw = global_norm(reference)
    spy = StepSpy(trainer.optimizer, trainer.model)
    _, reported = trainer._train_step(lr=1e-3)
    stepped = spy.grads[0]
    if clip is None:
        assert reported is None
        assert global_norm(stepped) == pytest.approx(raw, rel=1e-4)
    else:
        assert raw > 10 * clip, "the test needs a gradient the clip actually shortens"
        assert float(reported) == pytest.approx(raw, rel=1e-4)  # the logged norm is the norm before clipping
        assert global_norm(stepped) == pytest.approx(clip, rel=1e-4)
        for name, g in stepped.items():  # clipping scales every gradient by one factor: clip / raw
            torch.testing.assert_close(g, reference[name] * (clip / raw), rtol=1e-4, atol=1e-7)


def test_accumulated_micro_batches_step_with_the_whole_batch_mean_gradient(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path, batch_size=2, grad_accum=2, grad_clip=None)
    reference = whole_batch_grads(trainer.model, trainer.train_rows.rows(0, 4))  # the 4 rows of step 0
    spy = StepSpy(trainer.optimizer, trainer.model)
    trainer._train_step(lr=1e-3)
    for name, g in spy.grads[0].items():
        torch.testing.assert_close(g, reference[name], rtol=1e-4, atol=1e-7)


def test_a_resumed_run_steps_with_its_own_optimizer_settings(tmp_path: Path, corpus_dir: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    train(tiny_train_spec(data=str(corpus_dir), out_dir=str(out), steps=4, save_every=4, eval_every=0))
    spies: list[StepSpy] = []
    original_init = Trainer.__init__

    def init(self: Trainer, **kwargs: Any) -> None:
        original_init(self, **kwargs)
        spies.append(StepSpy(self.optimizer, self.model))

    monkeypatch.setattr(Trainer, "__init__", init)
    new = dict(steps=6, lr=2e-3, min_lr=1e-4, warmup_steps=1, weight_decay=0.05, betas=[0.8, 0.9], eps=1e-6)
    train(tiny_train_spec(data=str(corpus_dir), out_dir=str(out), eval_every=0, **new), resume=True)
    # torch.distributed's state loading runs one step at lr 0 to create the state; then the run's two steps.
    real = [groups for groups in spies[0].groups if groups[0]["lr"] > 0]
    assert len(real) == 2
    decay, no_decay = real[0]  # the first step after the resume (step index 4)
    expected_lr = learning_rate(4, schedule="warmup_cosine", lr=2e-3, min_lr=1e-4, warmup_steps=1, steps=6)
    for group in (decay, no_decay):
        assert group["betas"] == (0.8, 0.9) and group["eps"] == 1e-6
        assert group["lr"] == pytest.approx(expected_lr)
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
    assert TINY_TRAIN["lr"] != 2e-3 and TrainSpec().weight_decay != 0.05  # the saved run's were different


def test_the_evaluation_loss_is_the_mean_over_every_target_token(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    val = rng.integers(0, 256, size=7 * 32 + 1)  # 7 rows: batches of 4 and 3, the last one short
    trainer = make_trainer(tmp_path, val=val, batch_size=4, eval_steps=None)
    assert trainer.val_rows.count == 7
    model = trainer.model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for index in range(7):  # one row at a time, summing per-token losses by hand
            row = torch.from_numpy(val[index * 32 : index * 32 + 33]).unsqueeze(0)
            log_probs = torch.log_softmax(model(row[:, :-1])[0].double(), dim=-1)  # (T, vocab)
            targets = row[0, 1:]
            total += float(-log_probs[torch.arange(32), targets].sum())
            count += 32
    model.train()
    assert trainer.evaluate() == pytest.approx(total / count, rel=1e-6)
