"""Training a model with multi-token prediction depths (model.mtp): the MTP loss against its formula written out
here, where its gradient goes, what is logged, exact resume, and the setups that are refused."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml

import specformer
from specformer.cli.main import main
from specformer.errors import UserError
from specformer.registry.discovery import get_plugin_manager
from specformer.tokenizers.tokenizer import ByteTokenizer
from specformer_train import TrainingDiverged
from specformer_train.config import TrainSpec
from specformer_train.data import PackedRows
from specformer_train.metrics import read_metrics
from specformer_train.mtp_loss import check_mtp_training
from specformer_train.parallel.layout import ParallelLayout
from specformer_train.progress import ProgressBar
from specformer_train.trainer import Trainer

from .conftest import NaNFrom, tiny_train_spec
from .test_trainer import BASE, MODEL, T, MaskedRows, Recorder

pytestmark = pytest.mark.usefixtures("thread_count_recorded_not_applied", "progress_bars_without_a_shared_lock")

TOKENS = np.random.default_rng(0).integers(0, 256, size=2000)  # no end-of-text (256): plain causal rows


def mtp_model(weights: list[float]) -> dict[str, Any]:
    """The trainer tests' tiny model with one MTP depth per weight."""
    return {**copy.deepcopy(MODEL), "mtp": {"depths": len(weights), "loss_weights": weights}}


def make(out: Path, weights: list[float], *, rows: PackedRows | None = None, model_seed: int = 0,
         ctx: ParallelLayout | None = None, **settings: Any) -> Trainer:
    train = {**BASE, "grad_clip": None, **settings}
    model = specformer.build({"model": mtp_model(weights), "train": train}, seed=model_seed)
    return Trainer(model=model, config=TrainSpec(**train), train_rows=rows or PackedRows(TOKENS, seq_len=T, seed=0),
                   val_rows=None, tokenizer=ByteTokenizer(), out_dir=out, device="cpu", ctx=ctx)


class StepSpy:
    """The gradients each ``optimizer.step`` sees, by name, of the parameters that have one."""

    def __init__(self, trainer: Trainer) -> None:
        self.grads: list[dict[str, torch.Tensor]] = []
        step, model = trainer.optimizer.step, trainer.model

        def spy(*args: Any, **kwargs: Any) -> Any:
            self.grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})
            return step(*args, **kwargs)

        trainer.optimizer.step = spy


@pytest.fixture
def recorder() -> Any:
    rec = Recorder()
    manager = get_plugin_manager()
    manager.register(rec, name="mtp-recorder")
    yield rec
    manager.unregister(rec)


def hand_losses(model: torch.nn.Module, rows: torch.Tensor, weights: list[float],
                counted: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """(next-token CE, sum_k w_k CE_k, [CE_k]) of ``rows`` (B, T + 1), written out: depth k's row i predicts token
    i + k + 1 of the row; ``counted`` (B, T + 1) marks the row tokens a loss mask keeps as targets."""
    inputs = rows[:, :-1]
    logits, mtp = model(inputs, with_mtp=True)
    per_depth = []
    for k in range(1, len(weights) + 1):
        predicted = rows[:, k + 1:]  # (B, T - k): token i + k + 1 for rows i = 0 .. T - k - 1
        ce = F.cross_entropy(mtp[k - 1].flatten(0, 1), predicted.flatten(), reduction="none")
        keep = counted[:, k + 1:].flatten() if counted is not None else torch.ones_like(ce, dtype=torch.bool)
        per_depth.append(ce[keep].mean())
    main = F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten(), reduction="none")
    keep = counted[:, 1:].flatten() if counted is not None else torch.ones_like(main, dtype=torch.bool)
    return main[keep].mean(), sum(w * ce for w, ce in zip(weights, per_depth)), per_depth


@pytest.mark.parametrize("masked", [False, True])
def test_the_mtp_loss_is_the_weighted_sum_of_each_depths_mean_ce_and_joins_the_objective(
        tmp_path: Path, recorder: Recorder, masked: bool) -> None:
    weights = [0.3, 0.1]
    rows = MaskedRows(TOKENS, seq_len=T, seed=0) if masked else PackedRows(TOKENS, seq_len=T, seed=0)
    trainer = make(tmp_path, weights, rows=rows, steps=1)
    model = copy.deepcopy(trainer.model)
    batch = torch.from_numpy(rows.rows(0, 2))
    counted = torch.from_numpy(rows.loss_mask(0, 2)) if masked else None
    main, mtp, per_depth = hand_losses(model, batch, weights, counted)
    (main + mtp).backward()  # the objective by hand
    main, mtp, per_depth = main.detach(), mtp.detach(), [c.detach() for c in per_depth]
    spy = StepSpy(trainer)
    trainer.fit()
    record = recorder.steps[1]
    assert record["loss"] == pytest.approx(float(main), rel=1e-5)  # the plain next-token loss, as without MTP
    assert record["mtp_loss"] == pytest.approx(float(mtp), rel=1e-5)
    assert [record["mtp_loss_1"], record["mtp_loss_2"]] == pytest.approx([float(c) for c in per_depth], rel=1e-5)
    for name, param in model.named_parameters():
        torch.testing.assert_close(spy.grads[0][name], param.grad, rtol=1e-4, atol=1e-6, msg=name)
    assert float(spy.grads[0]["mtp.1.eh_proj.weight"].abs().sum()) > 0  # the gradient reaches every depth


def test_a_depth_weighted_0_after_the_last_weighted_one_gets_no_gradient(tmp_path: Path, recorder: Recorder) -> None:
    trainer = make(tmp_path, [0.3, 0.0], steps=1)
    spy = StepSpy(trainer)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if n.startswith("mtp.1.")}
    trainer.fit()
    assert spy.grads[0]["mtp.0.eh_proj.weight"].abs().sum() > 0
    assert not any(n.startswith("mtp.1.") for n in spy.grads[0])  # spy keeps the parameters that have a gradient
    for name, value in before.items():
        assert torch.equal(trainer.model.get_parameter(name), value), name  # not moved, not even by weight decay
    assert set(k for k in recorder.steps[1] if k.startswith("mtp")) == {"mtp_loss", "mtp_loss_1"}
    assert not any(p.requires_grad for p in trainer.model.mtp[1].parameters())  # frozen: no optimizer state


def test_a_run_with_a_depth_no_loss_reaches_resumes_exactly(tmp_path: Path) -> None:
    whole = make(tmp_path, [0.3, 0.0], steps=2, save_every=1)
    whole.fit()
    resumed = make(tmp_path, [0.3, 0.0], steps=2, model_seed=1)
    resumed.fit(resume_from=tmp_path / "checkpoints" / "step-0000001")  # no optimizer state for depth 2 is expected
    for (name, a), b in zip(whole.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_all_weights_0_train_without_running_the_depths(tmp_path: Path, recorder: Recorder) -> None:
    trainer = make(tmp_path, [0.0, 0.0], steps=1)
    ran: list[int] = []
    trainer.model.mtp[0].register_forward_hook(lambda *_: ran.append(1))
    spy = StepSpy(trainer)
    trainer.fit()
    assert ran == [] and not any(n.startswith("mtp.") for n in spy.grads[0])
    assert not any(k.startswith("mtp") for k in recorder.steps[1])


def test_a_short_run_lowers_the_mtp_loss(tmp_path: Path, recorder: Recorder) -> None:
    # A repeating sequence of 13 tokens: the tokens 2 and 3 ahead are learnable from the current one.
    rows = PackedRows(np.tile(np.arange(13), 200), seq_len=T, seed=0)
    make(tmp_path, [0.5, 0.5], rows=rows, steps=30, lr=3e-2, min_lr=3e-3, warmup_steps=2).fit()
    first, last = recorder.steps[1], recorder.steps[30]
    for key in ("mtp_loss_1", "mtp_loss_2"):
        assert last[key] < first[key] - 2.0, key
    assert last["mtp_loss"] < first["mtp_loss"]


def test_with_gradient_accumulation_the_mtp_loss_is_the_mean_of_the_micro_batches(tmp_path: Path,
                                                                                 recorder: Recorder) -> None:
    weights = [0.3, 0.2]
    trainer = make(tmp_path, weights, steps=1, batch_size=1, grad_accum=2)
    model = copy.deepcopy(trainer.model)
    rows = trainer.train_rows
    hand = [hand_losses(model, torch.from_numpy(rows.rows(i, 1)), weights)[1] for i in range(2)]
    trainer.fit()
    assert recorder.steps[1]["mtp_loss"] == pytest.approx(float(sum(hand).detach() / 2), rel=1e-5)


def test_resuming_with_mtp_gives_the_uninterrupted_runs_weights_and_losses_exactly(tmp_path: Path) -> None:
    whole = make(tmp_path / "a", [0.3, 0.1], steps=4, save_every=2)
    whole.fit()
    uninterrupted = read_metrics(tmp_path / "a" / "metrics.jsonl")
    resumed = make(tmp_path / "a", [0.3, 0.1], steps=4, model_seed=1)
    resumed.fit(resume_from=tmp_path / "a" / "checkpoints" / "step-0000002")
    for (name, a), b in zip(whole.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name
    keys = ("kind", "step", "loss", "mtp_loss", "mtp_loss_1", "mtp_loss_2")
    again = read_metrics(tmp_path / "a" / "metrics.jsonl")
    assert [[r.get(k) for k in keys] for r in again] == [[r.get(k) for k in keys] for r in uninterrupted]
    assert all(r["mtp_loss"] > 0 for r in again if r["kind"] == "train")


@pytest.mark.parametrize(("layout", "needle"), [
    (dict(cp=2), "model.mtp with train.parallel.cp 2: depth k reads the token k positions ahead"),
    (dict(tp=2), "model.mtp with train.parallel.tp 2: the MTP depths' blocks are not split"),
    (dict(ep=2), "model.mtp with train.parallel.ep 2: the MTP depths' blocks are not split"),
])
def test_splits_that_break_the_shift_or_the_depths_are_refused(tmp_path: Path, layout: dict, needle: str) -> None:
    ctx = ParallelLayout(mode="ddp", world_size=2, **layout)
    with pytest.raises(UserError, match=needle.replace("(", r"\(")):
        make(tmp_path, [0.3], ctx=ctx)
    make(tmp_path / "unweighted", [0.0], steps=1)  # depths weighted 0 train nothing and need no refusal
    model = specformer.build({"model": mtp_model([0.0])}, seed=0)
    check_mtp_training(model, seq_len=T, tp=1, ep=1, cp=2)


def test_a_sequence_too_short_for_the_deepest_depth_exits_2_from_the_cli(tmp_path: Path, corpus_dir: Path,
                                                                        capsys: pytest.CaptureFixture) -> None:
    spec = tiny_train_spec(data=str(corpus_dir), seq_len=2)
    spec["model"]["mtp"] = {"depths": 2}
    path = tmp_path / "mtp.yaml"
    path.write_text(yaml.safe_dump(spec))
    code = main(["train", str(path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "model.mtp: depth 2 predicts the token 3 ahead, so train.seq_len must be greater than 2, got 2" in err


def test_a_nan_mtp_loss_stops_the_run_though_the_next_token_loss_is_finite(tmp_path: Path, recorder: Recorder) -> None:
    trainer = make(tmp_path, [0.3], steps=4, save_every=1)
    trainer.model.mtp[0].final_norm.register_forward_hook(NaNFrom(3))  # the depth's logits only
    with pytest.raises(TrainingDiverged, match="the MTP loss became nan at step 3;"):
        trainer.fit()
    assert [math.isfinite(recorder.steps[s]["loss"]) for s in (1, 2)] == [True, True]
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step-0000002"


def test_the_progress_bar_shows_the_mtp_loss_beside_the_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    bar = ProgressBar(total=2, initial=0, enabled=False, flops_per_token=1.0, peak=None, world_size=1)
    shown: list[dict] = []
    monkeypatch.setattr(bar.bar, "set_postfix", lambda values, refresh=True: shown.append(dict(values)))
    bar.update(1, loss=2.5, lr=1e-3, tokens_per_s=10.0, mtp_loss=0.75)
    bar.update(1, loss=2.5, lr=1e-3, tokens_per_s=10.0)
    assert list(shown[0])[:3] == ["loss", "mtp", "lr"] and shown[0]["mtp"] == "0.7500"
    assert "mtp" not in shown[1]


def test_with_documents_the_depths_run_masked_by_document_as_the_main_model(tmp_path: Path,
                                                                           recorder: Recorder) -> None:
    tokens = TOKENS.copy()
    tokens[::5] = 256  # end-of-text every 5 tokens: several documents per row
    rows = PackedRows(tokens, seq_len=T, seed=0)
    weights = [0.3, 0.1]
    trainer = make(tmp_path, weights, rows=rows, steps=1)
    model = copy.deepcopy(trainer.model)
    batch = rows.rows(0, 2)
    layout = trainer._layout(batch[:, :-1])
    assert set(layout) == {"document_ids", "positions"}
    logits, mtp = model(torch.from_numpy(batch[:, :-1]), with_mtp=True, **layout)
    ids = torch.from_numpy(batch)
    hand = sum(w * F.cross_entropy(mtp[k - 1].flatten(0, 1), ids[:, k + 1:].flatten())
               for k, w in enumerate(weights, start=1))
    _, plain = model(torch.from_numpy(batch[:, :-1]), with_mtp=True)
    trainer.fit()
    assert recorder.steps[1]["mtp_loss"] == pytest.approx(float(hand.detach()), rel=1e-5)
    # the documents reach the depths: each depth's logits move (by ~0.02 here) when the layout is left out
    assert all(float((a - b).detach().abs().max()) > 1e-3 for a, b in zip(mtp, plain))
