"""The training loop, run in-process on tiny models.

End to end through ``train()``: learning, determinism, equivalences, outputs, failures. Then the
Trainer's bookkeeping pinned against hand computations: which step logs, evaluates and saves, the
learning rate and gradient each optimizer step gets, what a micro-batch reads, the loss it reports,
the NaN stop, Ctrl-C, resuming, and what ends up in the checkpoint and the final files."""

from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path
import signal
from typing import Any

import numpy as np
import pytest
import torch
import torch._dynamo  # noqa: F401  imported once here, not in each test: the mutation run forks per mutant
import torch.distributed.checkpoint.state_dict  # noqa: F401  (what every checkpoint save imports)
import torch.nn.functional as F

import specformer
from specformer.checkpoint.save_load import read_metadata
from specformer.errors import UserError
from specformer.registry.hookspecs import hookimpl
from specformer.registry.discovery import get_plugin_manager
from specformer.tokenizers.tokenizer import ByteTokenizer, METADATA_KEY
from specformer_train import TrainingDiverged, train
from specformer_train.checkpointing import latest_checkpoint
from specformer_train.config import TrainSpec
from specformer_train.data import EvalRows, PackedRows
from specformer_train.parallel.layout import ParallelLayout
from specformer_train.metrics import read_metrics
from specformer_train.run import mesh_change
from specformer_train.trainer import (IGNORE, Trainer, _allow_tf32, _compiles, _cpu_threads,
                                      _precision, _step_of, lm_loss)
import specformer_train.trainer as trainer_module

from fixtures import tiny

from .conftest import NaNFrom, tiny_train_spec


END_TO_END = pytest.mark.mutation_exempt("trains through train() for seconds, once per mutant; the Trainer tests "
                                         "below pin the loop's bookkeeping on a smaller model")
pytestmark = pytest.mark.usefixtures("thread_count_recorded_not_applied", "progress_bars_without_a_shared_lock")


def run(out: Path, corpus: Path, **train_settings: Any) -> tuple[Any, list[dict]]:
    result = train(tiny_train_spec(data=str(corpus), out_dir=str(out), **train_settings))
    return result, read_metrics(out / "metrics.jsonl")


def losses(records: list[dict]) -> list[float]:
    return [r["loss"] for r in records if r["kind"] == "train"]


@END_TO_END
def test_learns_and_writes_its_outputs(tmp_path: Path, corpus_dir: Path) -> None:
    result, records = run(tmp_path / "run", corpus_dir, steps=40, eval_every=20, save_every=20, plot=True)
    train_losses = losses(records)
    assert [r["step"] for r in records if r["kind"] == "train"] == list(range(1, 41))
    assert train_losses[0] > 5.0 and sum(train_losses[-5:]) / 5 < train_losses[0] - 2.0
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [20, 40]
    assert evals[-1]["val_perplexity"] == pytest.approx(2.718281828 ** evals[-1]["val_loss"], rel=1e-6)
    assert result.status == "finished" and result.val_loss == evals[-1]["val_loss"]
    assert all(k in records[-2] for k in ("lr", "tokens_per_s", "grad_norm", "gflops_per_s"))

    run_dir = tmp_path / "run"
    assert result.model_path == run_dir / "model.safetensors"
    assert (run_dir / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(read_metadata(result.model_path)[METADATA_KEY]) == {"kind": "byte"}
    assert json.loads((run_dir / "tokenizer.json").read_text()) == {"kind": "byte"}
    loaded = specformer.load(result.model_path)
    saved = specformer.load(result.checkpoint / "model.safetensors")
    for (name, a), (_, b) in zip(loaded.state_dict().items(), saved.state_dict().items()):
        assert torch.equal(a, b), name
    assert loaded.spec.section("train").steps == 40


@END_TO_END
def test_checkpoints_hold_no_pickle_and_only_the_last_k_are_kept(tmp_path: Path, corpus_dir: Path) -> None:
    run(tmp_path / "run", corpus_dir, steps=12, save_every=2, eval_every=0, keep_last=2)
    root = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-0000010", "step-0000012"]
    assert (root / "latest").read_text() == "step-0000012"
    files = sorted(p.name for p in (root / "step-0000012").iterdir())
    assert files == ["model.safetensors", "optimizer.safetensors", "rng-rank0.safetensors", "tokenizer.json",
                     "trainer.json"]
    state = json.loads((root / "step-0000012" / "trainer.json").read_text())
    assert state["step"] == 12 and state["sequences"] == 12 * 4 and state["tokens"] == 12 * 4 * 32
    assert state["extra"]["mesh"] == {"processes": 1, "distributed": "none", "dp": 1, "tp": 1, "ep": 1, "cp": 1}


def test_resuming_on_another_mesh_says_which() -> None:
    one = ParallelLayout().mesh()
    two = ParallelLayout(mode="tp", world_size=2, tp=2).mesh()
    assert mesh_change(one, one) is None and mesh_change(None, two) is None  # before meshes were recorded: quiet
    assert mesh_change(one, two) == ("note: resuming a checkpoint written by processes 1, distributed none, dp 1, tp 1, "
                                     "ep 1, cp 1 onto processes 2, distributed tp, dp 1, tp 2, ep 1, cp 1")


@END_TO_END
def test_seeded_runs_repeat_exactly(tmp_path: Path, corpus_dir: Path) -> None:
    _, a = run(tmp_path / "a", corpus_dir)
    _, b = run(tmp_path / "b", corpus_dir)
    assert losses(a) == losses(b)
    _, c = run(tmp_path / "c", corpus_dir, seed=7)
    assert losses(c) != losses(a)


@END_TO_END
def test_gradient_accumulation_equals_the_bigger_batch(tmp_path: Path, corpus_dir: Path) -> None:
    _, whole = run(tmp_path / "a", corpus_dir, batch_size=4, grad_accum=1)
    _, accumulated = run(tmp_path / "b", corpus_dir, batch_size=2, grad_accum=2)
    assert losses(accumulated) == pytest.approx(losses(whole), abs=1e-5)


@END_TO_END
def test_a_fresh_start_keeps_an_earlier_run_unless_told_to_overwrite_it(tmp_path: Path, corpus_dir: Path,
                                                                          capsys: pytest.CaptureFixture) -> None:
    run(tmp_path / "run", corpus_dir, steps=8, save_every=4)
    root = tmp_path / "run" / "checkpoints"
    before = sorted(p.name for p in root.iterdir())
    with pytest.raises(specformer.UserError, match=r"holds an earlier run \(step-0000004, step-0000008, "
                                                   r"model.safetensors\); continue it with --resume, replace it "
                                                   r"with --overwrite, or train into another directory"):
        run(tmp_path / "run", corpus_dir, steps=2)
    assert sorted(p.name for p in root.iterdir()) == before
    with pytest.raises(specformer.UserError, match="fewer than one global batch"):
        train(tiny_train_spec(data=str(corpus_dir), out_dir=str(tmp_path / "run"), batch_size=5000), overwrite=True)
    assert latest_checkpoint(tmp_path / "run").name == "step-0000008", "a failed start must not delete a run"
    capsys.readouterr()
    train(tiny_train_spec(data=str(corpus_dir), out_dir=str(tmp_path / "run"), steps=2, save_every=0, eval_every=0),
          overwrite=True)
    assert "--overwrite: removed 2 checkpoint(s) of the earlier run" in capsys.readouterr().out
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-0000002"]
    with pytest.raises(specformer.UserError, match=r"has no checkpoint to resume from"):
        train(tiny_train_spec(data=str(corpus_dir), out_dir=str(tmp_path / "empty")), resume=True)
    with pytest.raises(specformer.UserError, match=r"not a checkpoint directory"):
        train(tiny_train_spec(data=str(corpus_dir), out_dir=str(tmp_path / "run")), resume=str(tmp_path))
    with pytest.raises(specformer.UserError, match=r"give one of them"):
        train(tiny_train_spec(data=str(corpus_dir), out_dir=str(tmp_path / "run")), resume=True, overwrite=True)


@END_TO_END
def test_resuming_with_another_tokenizer_is_refused(tmp_path: Path, corpus_dir: Path) -> None:
    run(tmp_path / "run", corpus_dir, steps=2, save_every=0, eval_every=0)
    spec = tiny_train_spec(data=str(corpus_dir), out_dir=str(tmp_path / "run"), tokenizer="bpe")
    spec["model"]["vocab_size"] = 259
    with pytest.raises(specformer.CheckpointError, match="different tokenizer"):
        train(spec, resume=True)


@END_TO_END
def test_log_every_batches_reads_without_losing_steps(tmp_path: Path, corpus_dir: Path) -> None:
    _, every = run(tmp_path / "a", corpus_dir)
    _, batched = run(tmp_path / "b", corpus_dir, log_every=3)
    assert losses(batched) == losses(every)
    train_records = [r for r in batched if r["kind"] == "train"]
    # read back every 3 steps and before step 4's evaluation and save: windows 1-3, 4, 5-7, 8
    assert [("tokens_per_s" in r) for r in train_records] == [False, False, True, True, False, False, True, True]
    assert [r["tokens"] for r in train_records] == [r["tokens"] for r in every if r["kind"] == "train"]
    assert [r["grad_norm"] for r in train_records] == [r["grad_norm"] for r in every if r["kind"] == "train"]


@END_TO_END
def test_samples_use_the_generate_plugin_without_changing_training(tmp_path: Path, corpus_dir: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("specformer_generate")
    _, quiet = run(tmp_path / "a", corpus_dir, sample_tokens=0)
    capsys.readouterr()
    _, sampled = run(tmp_path / "b", corpus_dir, sample_tokens=12, sample_prompt="the ")
    out = capsys.readouterr().out
    assert out.count("--- sample at step") == 2 and "\nthe " in out
    assert losses(sampled) == losses(quiet)


@END_TO_END
def test_bf16_autocast_runs_on_request_and_changes_the_numbers(tmp_path: Path, corpus_dir: Path) -> None:
    _, fp32 = run(tmp_path / "a", corpus_dir, steps=3, eval_every=0)
    _, bf16 = run(tmp_path / "b", corpus_dir, steps=3, eval_every=0, precision="bf16")
    assert losses(bf16) == pytest.approx(losses(fp32), abs=0.05)  # the same training, rounded to bf16
    assert losses(bf16) != losses(fp32)


@END_TO_END
@pytest.mark.slow
def test_compiled_training_matches_eager(tmp_path: Path, corpus_dir: Path) -> None:
    _, eager = run(tmp_path / "a", corpus_dir)
    _, compiled = run(tmp_path / "b", corpus_dir, compile=True)
    assert losses(compiled) == pytest.approx(losses(eager), abs=1e-4)


# -- the Trainer itself, on a model small enough to run every test once per mutant -------------

T = 8  # sequence length
MODEL: dict[str, Any] = tiny.tiny_spec(
    vocab_size=259, d_model=16, n_layers=1, context_length=T,
    block={"mixer": {"kind": "attention", "n_heads": 2}, "ffn": {"kind": "swiglu", "hidden": 32}},
)["model"]
BASE: dict[str, Any] = {
    "steps": 4, "batch_size": 2, "lr": 1e-2, "min_lr": 1e-3, "warmup_steps": 1, "schedule": "linear",
    "eval_every": 0, "eval_steps": None, "save_every": 0, "keep_last": 10, "sample_tokens": 0,
    "progress": False, "plot": False, "tensorboard": False, "threads": 1, "seed": 5,
}


def make_trainer(out: Path, *, val: bool = True, model_seed: int = 0, val_rows: EvalRows | None = None,
                 data_record: dict | None = None, ctx: ParallelLayout | None = None, **settings: Any) -> Trainer:
    train = {**BASE, **settings}
    config = TrainSpec(**train)
    tokens = np.random.default_rng(0).integers(0, 256, size=2000)  # no end-of-text (256): plain causal rows
    if val_rows is None and val:
        val_rows = EvalRows(np.random.default_rng(1).integers(0, 256, size=5 * T + 1), seq_len=T)
    model = specformer.build({"model": copy.deepcopy(MODEL), "train": train}, seed=model_seed)
    return Trainer(model=model, config=config, train_rows=PackedRows(tokens, seq_len=T, seed=0), val_rows=val_rows,
                   tokenizer=ByteTokenizer(), out_dir=out, device="cpu", data_record=data_record, ctx=ctx)


def hand_lr(step: int, *, lr: float = 1e-2, min_lr: float = 1e-3, warmup: int = 1, steps: int = 4) -> float:
    """``schedule: linear``, written out: linear warm-up to ``lr``, then a straight line down to ``min_lr``."""
    if step < warmup:
        return lr * (step + 1) / (warmup + 1)
    return lr + (min_lr - lr) * (step - warmup) / (steps - warmup)


def mean_ce(model: torch.nn.Module, rows: np.ndarray) -> float:
    """Mean next-token cross-entropy of ``rows`` (B, T + 1), summed token by token in float64."""
    batch = torch.from_numpy(rows)
    with torch.no_grad():
        log_probs = torch.log_softmax(model(batch[:, :-1]).double(), dim=-1)  # (B, T, vocab)
    picked = log_probs.gather(-1, batch[:, 1:].unsqueeze(-1)).squeeze(-1)  # (B, T)
    return float(-picked.sum() / picked.numel())


class Recorder:
    """The training hooks, recorded in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []
        self.steps: dict[int, dict] = {}
        self.evals: dict[int, dict] = {}
        self.end: dict | None = None
        self.rng_at_start: torch.Tensor | None = None
        self.interrupt_at: int | None = None
        self.out_dirs: list[str] = []

    @hookimpl
    def specformer_on_train_start(self, out_dir: str) -> None:
        self.rng_at_start = torch.get_rng_state()
        self.out_dirs.append(out_dir)
        self.events.append(("start", 0))

    @hookimpl
    def specformer_on_train_step(self, step: int, metrics: dict) -> None:
        self.events.append(("step", step))
        self.steps[step] = dict(metrics)
        if step == self.interrupt_at:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: the loop finishes this step and stops

    @hookimpl
    def specformer_on_eval(self, step: int, metrics: dict) -> None:
        self.events.append(("eval", step))
        self.evals[step] = dict(metrics)

    @hookimpl
    def specformer_on_checkpoint_saved(self, step: int, path: str) -> None:
        assert Path(path).name == f"step-{step:07d}" and Path(path, "model.safetensors").is_file()
        self.events.append(("saved", step))

    @hookimpl
    def specformer_on_train_end(self, step: int, metrics: dict, out_dir: str) -> None:
        self.events.append(("end", step))
        self.end = dict(metrics)
        self.out_dirs.append(out_dir)


@pytest.fixture
def recorder() -> Any:
    rec = Recorder()
    manager = get_plugin_manager()
    manager.register(rec, name="trainer-recorder")
    yield rec
    manager.unregister(rec)


class StepSpy:
    """Records what each ``optimizer.step`` is called with: the gradients and the groups' settings."""

    def __init__(self, trainer: Trainer) -> None:
        self.grads: list[dict[str, torch.Tensor]] = []
        self.groups: list[list[dict[str, Any]]] = []
        step = trainer.optimizer.step
        model = trainer.model

        def spy(*args: Any, **kwargs: Any) -> Any:
            self.grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
            self.groups.append([{k: v for k, v in g.items() if k != "params"} for g in trainer.optimizer.param_groups])
            return step(*args, **kwargs)

        trainer.optimizer.step = spy


def seen_inputs(trainer: Trainer) -> list[torch.Tensor]:
    """Every training forward's input ids, in order."""
    seen: list[torch.Tensor] = []
    trainer.model.register_forward_pre_hook(
        lambda module, args: seen.append(args[0].clone()) if module.training else None)
    return seen


def test_log_eval_and_save_happen_at_their_intervals_and_once_at_the_end(tmp_path: Path, recorder: Recorder) -> None:
    trainer = make_trainer(tmp_path, steps=5, log_every=2, eval_every=2, save_every=2)
    result = trainer.fit()
    assert recorder.events == [
        ("start", 0), ("step", 1), ("step", 2), ("eval", 2), ("saved", 2), ("step", 3), ("step", 4), ("eval", 4),
        ("saved", 4), ("step", 5), ("eval", 5), ("saved", 5), ("end", 5)]
    per_step = 2 * T  # batch_size rows of T targets
    for step, record in recorder.steps.items():
        assert record["tokens"] == step * per_step
        assert record["lr"] == pytest.approx(hand_lr(step - 1, steps=5))
        assert record["grad_norm"] > 0
        assert ("tokens_per_s" in record) == (step in (2, 4, 5)), step  # the last step of each read-back window
        assert ("params" in record) == (step == 1) and ("trainable_params" in record) == (step == 1)
    assert recorder.steps[1]["params"] == recorder.steps[1]["trainable_params"] == sum(
        p.numel() for p in trainer.model.parameters())
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.glob("step-*")) == ["step-0000002", "step-0000004", "step-0000005"]
    assert (root / "latest").read_text() == "step-0000005"
    assert result.status == "finished" and result.step == 5 and result.checkpoint == root / "step-0000005"
    assert result.loss == recorder.steps[5]["loss"] and result.val_loss == recorder.evals[5]["val_loss"]
    assert result.model_path == tmp_path / "model.safetensors"
    assert result.model_path.read_bytes() == (root / "step-0000005" / "model.safetensors").read_bytes()
    assert (tmp_path / "tokenizer.json").read_text() == (root / "step-0000005" / "tokenizer.json").read_text()
    assert recorder.end is not None
    assert recorder.end["loss"] == result.loss and recorder.end["tokens"] == 5 * per_step
    assert recorder.end["val_loss"] == result.val_loss and recorder.end["elapsed_s"] > 0
    for step, record in recorder.evals.items():
        assert record["val_perplexity"] == pytest.approx(math.exp(record["val_loss"]))
    saved = json.loads((root / "step-0000005" / "trainer.json").read_text())
    assert saved["step"] == 5 and saved["sequences"] == 10 and saved["tokens"] == 5 * per_step
    assert saved["last_val_loss"] == result.val_loss and saved["world_size"] == 1 and saved["threads"] == 1


def test_without_intervals_only_the_final_evaluation_and_checkpoint_happen(tmp_path: Path, recorder: Recorder) -> None:
    trainer = make_trainer(tmp_path, steps=3, eval_every=0, save_every=0)
    trainer.fit()
    assert recorder.events == [("start", 0), ("step", 1), ("step", 2), ("step", 3), ("eval", 3), ("saved", 3),
                               ("end", 3)]


def test_a_run_without_validation_rows_reports_no_validation_loss(tmp_path: Path, recorder: Recorder) -> None:
    trainer = make_trainer(tmp_path, val=False, steps=2, eval_every=1)
    result = trainer.fit()
    assert result.val_loss is None and "eval" not in [kind for kind, _ in recorder.events]
    assert recorder.end is not None and "val_loss" not in recorder.end
    assert trainer.evaluate() is None


def test_each_step_runs_at_the_scheduled_learning_rate(tmp_path: Path, recorder: Recorder) -> None:
    trainer = make_trainer(tmp_path, steps=4)
    spy = StepSpy(trainer)
    trainer.fit()
    assert len(spy.groups) == 4
    for index, groups in enumerate(spy.groups):
        for group in groups:
            assert group["lr"] == pytest.approx(hand_lr(index)), (index, group["lr"])
        assert recorder.steps[index + 1]["lr"] == pytest.approx(hand_lr(index))


def test_micro_batches_read_consecutive_rows_and_the_reported_loss_is_their_mean(tmp_path: Path,
                                                                                 recorder: Recorder) -> None:
    trainer = make_trainer(tmp_path, steps=2, grad_accum=2, grad_clip=None)
    start = copy.deepcopy(trainer.model).eval()
    seen = seen_inputs(trainer)
    spy = StepSpy(trainer)
    trainer.fit()
    rows = trainer.train_rows
    assert len(seen) == 4  # two steps of two micro-batches of two rows
    for k, inputs in enumerate(seen):
        assert torch.equal(inputs, torch.from_numpy(rows.rows(2 * k, 2)[:, :-1])), k
    first = (mean_ce(start, rows.rows(0, 2)) + mean_ce(start, rows.rows(2, 2))) / 2
    assert recorder.steps[1]["loss"] == pytest.approx(first, rel=1e-5)
    # The first step's gradient is the mean over its 4 rows, as one backward over the whole batch gives it.
    whole = copy.deepcopy(start).train()
    batch = torch.from_numpy(rows.rows(0, 4))
    F.cross_entropy(whole(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten()).backward()
    for name, p in whole.named_parameters():
        torch.testing.assert_close(spy.grads[0][name], p.grad, rtol=1e-4, atol=1e-7)
    assert trainer.state.sequences == 8 and trainer.state.tokens == 8 * T
    assert all("grad_norm" not in r for r in recorder.steps.values())  # no clipping: no norm computed


def test_the_step_uses_the_clipped_gradient_and_logs_the_norm_before_clipping(tmp_path: Path,
                                                                           recorder: Recorder) -> None:
    trainer = make_trainer(tmp_path, steps=1, grad_clip=0.05)
    start = copy.deepcopy(trainer.model)
    batch = torch.from_numpy(trainer.train_rows.rows(0, 2))
    F.cross_entropy(start(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten()).backward()
    raw = math.sqrt(sum(float(p.grad.double().square().sum()) for p in start.parameters()))
    assert raw > 10 * 0.05, "the test needs a gradient the clip shortens"
    spy = StepSpy(trainer)
    trainer.fit()
    stepped = math.sqrt(sum(float(g.double().square().sum()) for g in spy.grads[0].values()))
    assert stepped == pytest.approx(0.05, rel=1e-4)
    assert recorder.steps[1]["grad_norm"] == pytest.approx(raw, rel=1e-4)


def test_a_nan_loss_stops_at_its_step_naming_the_last_good_checkpoint(tmp_path: Path, recorder: Recorder) -> None:
    trainer = make_trainer(tmp_path, steps=6, save_every=2)
    trainer.model.final_norm.register_forward_hook(NaNFrom(3))
    with pytest.raises(TrainingDiverged) as info:
        trainer.fit()
    message = str(info.value)
    assert "became nan at step 3;" in message
    assert f"the last good checkpoint is {tmp_path / 'checkpoints' / 'step-0000002'} (step 2)" in message
    assert "now 0.01" in message  # the lr it suggests lowering
    assert recorder.events == [("start", 0), ("step", 1), ("step", 2), ("saved", 2), ("end", 3)]
    assert recorder.end is not None and math.isnan(recorder.end["loss"])
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step-0000002"
    assert not (tmp_path / "model.safetensors").exists()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]  # the good steps are logged


def test_a_nan_loss_before_any_checkpoint_says_none_was_saved(tmp_path: Path, recorder: Recorder) -> None:
    trainer = make_trainer(tmp_path, steps=4, log_every=3)
    trainer.model.final_norm.register_forward_hook(NaNFrom(2))
    with pytest.raises(TrainingDiverged, match=r"became nan at step 2; training stopped and no checkpoint was saved"):
        trainer.fit()
    assert [e for e in recorder.events if e[0] == "step"] == [("step", 1)]  # the window is read up to the bad step


def test_a_checkpoint_is_saved_only_after_its_steps_losses_were_read(tmp_path: Path, recorder: Recorder) -> None:
    """log_every longer than save_every: the losses are read before saving, so a NaN is never checkpointed."""
    trainer = make_trainer(tmp_path, steps=8, log_every=4, save_every=2, eval_every=2)
    trainer.model.final_norm.register_forward_hook(NaNFrom(6))
    with pytest.raises(TrainingDiverged, match=r"became nan at step 6; training stopped and the last good checkpoint "
                                               rf"is {tmp_path / 'checkpoints' / 'step-0000004'} \(step 4\)"):
        trainer.fit()
    assert recorder.events == [("start", 0), ("step", 1), ("step", 2), ("eval", 2), ("saved", 2), ("step", 3),
                               ("step", 4), ("eval", 4), ("saved", 4), ("step", 5), ("end", 6)]
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step-0000004"
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*")) == ["step-0000002", "step-0000004"]
    assert all(math.isfinite(r["loss"]) for r in recorder.steps.values())


def test_an_unexpected_error_is_not_reported_as_the_end_of_a_run(tmp_path: Path, recorder: Recorder) -> None:
    trainer = make_trainer(tmp_path, steps=3)

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("disk on fire")

    trainer.optimizer.step = broken
    with pytest.raises(RuntimeError, match="disk on fire"):
        trainer.fit()
    assert recorder.end is None and recorder.events == [("start", 0)]


def test_ctrl_c_finishes_the_step_saves_it_and_skips_the_final_evaluation(tmp_path: Path, recorder: Recorder) -> None:
    trainer = make_trainer(tmp_path, steps=5, eval_every=0, log_every=1)
    recorder.interrupt_at = 2
    result = trainer.fit()
    assert result.status == "interrupted" and result.step == 2
    assert recorder.events == [("start", 0), ("step", 1), ("step", 2), ("saved", 2), ("end", 2)]
    assert result.checkpoint == tmp_path / "checkpoints" / "step-0000002" and result.model_path is None
    assert not (tmp_path / "model.safetensors").exists()


def test_ctrl_c_between_read_backs_still_logs_the_steps_it_ran(tmp_path: Path, recorder: Recorder,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trainer_module, "time", FakeClock())
    trainer = make_trainer(tmp_path, steps=6, log_every=4)
    original = trainer._train_step

    def step_then_interrupt(lr: Any) -> Any:
        out = original(lr)
        if trainer.state.step == 1:  # state.step is the count before this step's increment
            os.kill(os.getpid(), signal.SIGINT)
        return out

    trainer._train_step = step_then_interrupt
    result = trainer.fit()
    assert result.status == "interrupted" and result.step == 2
    assert [e for e in recorder.events if e[0] == "step"] == [("step", 1), ("step", 2)]
    assert result.loss == recorder.steps[2]["loss"]
    assert recorder.steps[2]["tokens"] == 2 * 2 * T and recorder.steps[2]["tokens_per_s"] == 2 * 2 * T / 0.5


def test_the_run_is_seeded_from_train_seed(tmp_path: Path, recorder: Recorder) -> None:
    make_trainer(tmp_path, steps=1, seed=11).fit()
    assert torch.equal(recorder.rng_at_start, torch.manual_seed(11).get_state())


def test_resuming_continues_the_counters_rows_and_weights_exactly(tmp_path: Path, recorder: Recorder) -> None:
    whole = make_trainer(tmp_path / "a", steps=4, save_every=2)
    whole.fit()
    uninterrupted = [(r["kind"], r["step"], r.get("loss"), r.get("val_loss")) for r in read_metrics(tmp_path / "a" / "metrics.jsonl")]
    recorder.events.clear()
    recorder.steps.clear()
    resumed = make_trainer(tmp_path / "a", model_seed=1, steps=4, data_record={"kind": "test"})
    seen = seen_inputs(resumed)
    result = resumed.fit(resume_from=tmp_path / "a" / "checkpoints" / "step-0000002")
    assert [e for e in recorder.events if e[0] in ("step", "saved")] == [("step", 3), ("step", 4), ("saved", 4)]
    assert [recorder.steps[s]["tokens"] for s in (3, 4)] == [3 * 2 * T, 4 * 2 * T]
    assert recorder.steps[3]["lr"] == pytest.approx(hand_lr(2))
    assert "params" in recorder.steps[3]  # sizes logged once per run, resumed or not
    rows = resumed.train_rows
    assert len(seen) == 2
    assert torch.equal(seen[0], torch.from_numpy(rows.rows(4, 2)[:, :-1]))
    assert torch.equal(seen[1], torch.from_numpy(rows.rows(6, 2)[:, :-1]))
    for (name, a), b in zip(whole.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name  # restored weights, moments and counters: the same run
    assert result.checkpoint == tmp_path / "a" / "checkpoints" / "step-0000004"
    saved = json.loads((result.checkpoint / "trainer.json").read_text())
    assert saved["step"] == 4 and saved["sequences"] == 8 and saved["data"] == {"kind": "test"}
    assert saved["extra"]["documents"] == {"document_mask": True, "reset_positions": True}
    # the records the first run wrote after step 2 are dropped and written again by the resumed run, equal
    resumed_records = read_metrics(tmp_path / "a" / "metrics.jsonl")
    assert [(r["kind"], r["step"], r.get("loss"), r.get("val_loss")) for r in resumed_records] == uninterrupted


def test_a_resumed_run_keeps_its_own_optimizer_settings(tmp_path: Path) -> None:
    make_trainer(tmp_path, steps=1).fit()
    resumed = make_trainer(tmp_path, steps=2, weight_decay=0.05, betas=[0.8, 0.9], eps=1e-6, threads=2)
    spy = StepSpy(resumed)
    resumed.fit(resume_from=tmp_path / "checkpoints" / "step-0000001")
    groups = [g for g in spy.groups if g[0]["lr"] > 0]  # torch's state loading first steps once at lr 0
    assert len(groups) == 1
    for group in groups[0]:  # this run's settings, not the checkpoint's
        assert group["betas"] == (0.8, 0.9) and group["eps"] == 1e-6
        assert group["lr"] == pytest.approx(hand_lr(1, steps=2))
    assert [g["weight_decay"] for g in groups[0]] == [0.05, 0.0]
    assert TrainSpec().weight_decay != 0.05
    assert resumed.threads == 2 and torch.get_num_threads() == 2 and resumed.state.threads == 2


def test_resuming_a_finished_run_trains_saves_and_evaluates_nothing(tmp_path: Path, recorder: Recorder) -> None:
    make_trainer(tmp_path, steps=2).fit()
    recorder.events.clear()
    final = tmp_path / "checkpoints" / "step-0000002"
    result = make_trainer(tmp_path, steps=2).fit(resume_from=final)
    assert recorder.events == [("start", 0), ("end", 2)]
    assert recorder.end is not None and math.isnan(recorder.end["loss"])  # no step ran: no loss to report
    assert result.status == "finished" and result.step == 2 and result.checkpoint == final
    assert result.model_path == tmp_path / "model.safetensors"


def test_evaluation_averages_over_the_chosen_rows_tokens(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path, eval_steps=1, batch_size=2)
    val = trainer.val_rows
    assert val.count == 5
    chosen = val.chosen(2)  # eval_steps x batch_size rows, spread over the split
    model = trainer.model.eval()
    expected = sum(mean_ce(model, val.rows(chosen[i : i + 1])) for i in range(2)) / 2
    model.train()
    assert trainer.evaluate() == pytest.approx(expected, rel=1e-6)
    assert trainer.model.training  # evaluation puts the model back into training mode


class MaskedEvalRows(EvalRows):
    """Validation rows with a loss mask: only targets at even positions of the row count."""

    def loss_mask(self, indices: np.ndarray) -> np.ndarray:
        mask = np.zeros((len(indices), self.seq_len + 1), dtype=bool)  # (B, T + 1), aligned with the row
        mask[:, ::2] = True
        return mask


def test_a_loss_mask_limits_the_evaluation_to_the_counted_targets(tmp_path: Path) -> None:
    tokens = np.random.default_rng(3).integers(0, 256, size=3 * T + 1)
    trainer = make_trainer(tmp_path, val_rows=MaskedEvalRows(tokens, seq_len=T), batch_size=2)
    model = trainer.model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for index in range(3):
            row = torch.from_numpy(tokens[index * T : index * T + T + 1])
            log_probs = torch.log_softmax(model(row[None, :-1])[0].double(), dim=-1)  # (T, vocab)
            for t in range(T):
                if (t + 1) % 2 == 0:  # target t is row position t + 1
                    total -= float(log_probs[t, row[t + 1]])
                    count += 1
    model.train()
    assert count == 3 * T // 2
    assert trainer.evaluate() == pytest.approx(total / count, rel=1e-6)


def test_lm_loss_masked_is_the_mean_over_counted_targets_and_zero_when_none_count() -> None:
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([[1, IGNORE, 4], [IGNORE, 0, 2]])  # 4 counted, 2 not: the two counts differ
    log_probs = torch.log_softmax(logits.double(), dim=-1)
    expected = -(log_probs[0, 0, 1] + log_probs[0, 2, 4] + log_probs[1, 1, 0] + log_probs[1, 2, 2]) / 4
    assert float(lm_loss(logits, targets, masked=True)) == pytest.approx(float(expected), rel=1e-6)
    plain = torch.tensor([[1, 2, 4], [3, 0, 2]])
    every = -log_probs.gather(-1, plain.unsqueeze(-1)).mean()
    assert float(lm_loss(logits, plain, masked=False)) == pytest.approx(float(every), rel=1e-6)
    one = torch.full((2, 3), IGNORE)
    one[1, 2] = 2  # a single counted target: its own loss, not half of it
    assert float(lm_loss(logits, one, masked=True)) == pytest.approx(float(-log_probs[1, 2, 2]), rel=1e-6)
    nothing = torch.full((2, 3), IGNORE)
    assert float(lm_loss(logits, nothing, masked=True)) == 0.0


def test_evaluation_and_samples_are_printed(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("specformer_generate")
    trainer = make_trainer(tmp_path, steps=1, sample_tokens=3, sample_prompt="ab")
    trainer.fit()
    out = capsys.readouterr().out
    loss = trainer.state.last_val_loss
    assert f"step 1: val loss {loss:.4f}, perplexity {math.exp(loss):.2f}" in out
    assert "--- sample at step 1 ---\nab" in out
    assert trainer.sample(1).startswith("ab")
    assert make_trainer(tmp_path / "quiet", sample_tokens=0).sample(1) is None


def test_a_sequence_longer_than_the_context_is_refused(tmp_path: Path) -> None:
    config = TrainSpec(**BASE)
    model = specformer.build({"model": {**copy.deepcopy(MODEL), "context_length": T - 1}, "train": BASE}, seed=0)
    rows = PackedRows(np.zeros(200, dtype=np.int64), seq_len=T, seed=0)
    with pytest.raises(UserError, match=f"train.seq_len {T} is longer than model.context_length {T - 1}"):
        Trainer(model=model, config=config, train_rows=rows, val_rows=None, tokenizer=ByteTokenizer(),
                out_dir=tmp_path, device="cpu")


def test_the_thread_count_and_precision_are_set_for_the_cpu(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path, threads=2)
    assert trainer.threads == 2 and torch.get_num_threads() == 2 and trainer.state.threads == 2
    assert trainer.precision == "fp32" and not trainer.compiled
    assert _precision("auto", torch.device("cpu")) == "fp32" and _precision("bf16", torch.device("cpu")) == "bf16"


def test_step_of_reads_the_step_from_a_checkpoint_name() -> None:
    assert _step_of(Path("run/checkpoints/step-0000120")) == "120"
    assert _step_of(Path("step-0000000")) == "0"
    assert _step_of(None) == "?"


class FakeClock:
    """``time.perf_counter`` advancing ``tick`` seconds per reading: every read-back window lasts one tick."""

    def __init__(self, tick: float = 0.5) -> None:
        self.now, self.tick = 0.0, tick

    def perf_counter(self) -> float:
        self.now += self.tick
        return self.now


def test_throughput_is_the_window_tokens_over_the_window_time(tmp_path: Path, recorder: Recorder,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(trainer_module, "time", FakeClock())
    trainer = make_trainer(tmp_path, steps=5, log_every=2, progress=True)
    trainer.fit()
    per_step = 2 * T
    shown = {step: r["tokens_per_s"] for step, r in recorder.steps.items() if "tokens_per_s" in r}
    assert shown == {2: 4 * per_step, 4: 4 * per_step, 5: 2 * per_step}  # each window took half a fake second
    for step, rate in shown.items():
        assert recorder.steps[step]["gflops_per_s"] == pytest.approx(rate * trainer.flops_per_token / 1e9)
    assert trainer.state.elapsed_s == 1.5 and recorder.end is not None and recorder.end["elapsed_s"] == 1.5
    assert "5/5" in capsys.readouterr().err  # the bar counted every step


def test_rows_with_documents_get_their_document_ids_and_positions(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path, steps=1)
    tokens = np.random.default_rng(0).integers(0, 256, size=2000)
    tokens[3::5] = 256  # an end-of-text token every five
    trainer.train_rows = PackedRows(tokens, seq_len=T, seed=0)
    given: list[dict] = []
    trainer.model.register_forward_pre_hook(lambda m, args, kwargs: given.append(dict(kwargs)), with_kwargs=True)
    trainer.fit()
    inputs = trainer.train_rows.rows(0, 2)[:, :-1]
    ids, positions = np.zeros_like(inputs), np.zeros_like(inputs)
    for b in range(2):  # by hand: a document starts at each end-of-text token
        doc, start = 0, 0
        for t in range(T):
            if inputs[b, t] == 256:
                doc, start = doc + 1, t
            ids[b, t], positions[b, t] = doc, t - start
    assert (inputs[:, 1:] == 256).any()
    assert np.array_equal(given[0]["document_ids"].numpy(), ids)
    assert np.array_equal(given[0]["positions"].numpy(), positions)


class MaskedRows(PackedRows):
    """Training rows whose loss counts only the targets at even row positions."""

    def loss_mask(self, first: int, count: int) -> np.ndarray:
        mask = np.zeros((count, self.seq_len + 1), dtype=bool)  # (B, T + 1)
        mask[:, ::2] = True
        return mask


def test_a_loss_mask_limits_the_training_loss_to_the_counted_targets(tmp_path: Path, recorder: Recorder) -> None:
    trainer = make_trainer(tmp_path, steps=1)
    tokens = np.random.default_rng(0).integers(0, 256, size=2000)
    trainer.train_rows = MaskedRows(tokens, seq_len=T, seed=0)
    model = copy.deepcopy(trainer.model).eval()
    rows = torch.from_numpy(trainer.train_rows.rows(0, 2))
    with torch.no_grad():
        log_probs = torch.log_softmax(model(rows[:, :-1]).double(), dim=-1)  # (B, T, vocab)
    picked = [-float(log_probs[b, t, rows[b, t + 1]]) for b in range(2) for t in range(T) if (t + 1) % 2 == 0]
    trainer.fit()
    assert recorder.steps[1]["loss"] == pytest.approx(sum(picked) / len(picked), rel=1e-5)


def test_samples_are_drawn_with_the_configured_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict] = []
    monkeypatch.setattr(trainer_module, "sample_text", lambda model, tokenizer, **kw: calls.append(kw) or "text")
    trainer = make_trainer(tmp_path, sample_tokens=4, sample_prompt="hi", sample_temperature=0.7, sample_top_k=3)
    assert trainer.sample(6) == "text"
    assert calls == [{"prompt": "hi", "max_new_tokens": 4, "temperature": 0.7, "top_k": 3, "seed": 5 + 6,
                      "device": torch.device("cpu"), "chat": None}]


def test_a_huge_validation_loss_reports_a_finite_perplexity(tmp_path: Path, recorder: Recorder) -> None:
    trainer = make_trainer(tmp_path, steps=1)
    trainer.evaluate = lambda: 800.0  # type: ignore[method-assign]
    trainer.fit()
    assert recorder.evals[1] == {"val_loss": 800.0, "val_perplexity": math.exp(700.0)}


def test_a_failed_export_names_where_the_final_weights_are(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(source: Path, dest: Path) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(trainer_module, "copy_file_atomic", full)
    with pytest.raises(trainer_module.OutputError) as info:
        make_trainer(tmp_path, steps=1).fit()
    assert str(info.value) == (f"could not write {tmp_path / 'model.safetensors'}: No space left on device; the final "
                               f"weights are in {tmp_path / 'checkpoints' / 'step-0000001'}")


def test_the_model_is_put_in_training_mode_and_compiled_only_when_asked(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path)
    trainer.model.eval()
    again = Trainer(model=trainer.model, config=trainer.config, train_rows=trainer.train_rows, val_rows=None,
                    tokenizer=ByteTokenizer(), out_dir=tmp_path, device="cpu")
    assert again.model.training and not again.compiled
    assert not make_trainer(tmp_path, compile=False).compiled
    assert trainer.global_batch == 2 and make_trainer(tmp_path, grad_accum=3).global_batch == 6


def test_compile_true_hands_the_wrapped_model_to_torch_compile_on_the_cpu_too(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    compiled: list[torch.nn.Module] = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, *args, **kwargs: compiled.append(self))
    trainer = make_trainer(tmp_path, compile=True)
    assert trainer.compiled and compiled == [trainer.wrapped]
    assert not make_trainer(tmp_path, compile=False).compiled and len(compiled) == 1


def test_the_schedule_is_evaluated_once_per_step_and_the_logged_lr_is_the_applied_one(
        tmp_path: Path, corpus_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import specformer_train.schedule as schedule

    steps: list[int] = []
    original = schedule.phase_of
    monkeypatch.setattr(schedule, "phase_of", lambda step, **kw: steps.append(step) or original(step, **kw))
    applied: list[float] = []
    step_once = Trainer._train_step
    monkeypatch.setattr(Trainer, "_train_step", lambda self, lr: applied.append(lr) or step_once(self, lr))
    _, records = run(tmp_path / "run", corpus_dir, steps=3, warmup_steps=1, eval_every=0, save_every=0)
    assert steps == [0, 1, 2]
    # AdamW's two default groups are both at train.lr: each gets exactly the rate that is logged.
    assert [rates for rates in applied] == [[r["lr"], r["lr"]] for r in records if r["kind"] == "train"]


def test_compile_true_compiles_on_the_cpu_too(tmp_path: Path) -> None:
    assert make_trainer(tmp_path, compile=True).compiled  # torch compiles lazily, at the first forward


def test_too_few_rows_for_one_global_batch_are_refused(tmp_path: Path) -> None:
    config = TrainSpec(**{**BASE, "batch_size": 4, "grad_accum": 2})
    model = specformer.build({"model": copy.deepcopy(MODEL), "train": BASE}, seed=0)
    rows = PackedRows(np.zeros(7 * (T + 1), dtype=np.int64), seq_len=T, seed=0)  # 7 rows, a batch needs 8
    with pytest.raises(UserError, match="fewer than one global batch of 8 sequences"):
        Trainer(model=model, config=config, train_rows=rows, val_rows=None, tokenizer=ByteTokenizer(),
                out_dir=tmp_path, device="cpu")


def test_bf16_precision_runs_the_forward_under_autocast(tmp_path: Path) -> None:
    context = make_trainer(tmp_path, precision="bf16")._autocast()
    assert isinstance(context, torch.autocast) and context.fast_dtype == torch.bfloat16 and context.device == "cpu"
    assert not isinstance(make_trainer(tmp_path)._autocast(), torch.autocast)


def test_a_resume_keeps_what_this_run_does_not_say(tmp_path: Path, recorder: Recorder,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The checkpoint's data record, its auto thread count, the metrics written so far, and for a checkpoint
    from before document settings were recorded, training without them."""
    import specformer_train.threads as threads

    make_trainer(tmp_path, steps=1, data_record={"kind": "first"}).fit()
    path = tmp_path / "checkpoints" / "step-0000001"
    data = json.loads((path / "trainer.json").read_text())
    del data["extra"]["documents"]
    (path / "trainer.json").write_text(json.dumps(data))
    monkeypatch.setattr(threads, "auto_threads", lambda: 7)
    resumed = make_trainer(tmp_path, steps=2, threads="auto")
    assert resumed.threads == 7
    result = resumed.fit(resume_from=path)
    assert resumed.threads == 1 and torch.get_num_threads() == 1  # the saved count, for the same rounding
    assert resumed.documents == {"document_mask": False, "reset_positions": False}
    saved = json.loads((result.checkpoint / "trainer.json").read_text())
    assert saved["data"] == {"kind": "first"} and saved["threads"] == 1
    assert saved["extra"]["documents"] == {"document_mask": False, "reset_positions": False}
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in metrics if r["kind"] == "train"] == [1, 2]
    assert recorder.events[0] == ("start", 0) and recorder.out_dirs == [str(tmp_path)] * 4  # start and end, twice


def test_samples_run_eagerly_even_for_a_model_torch_would_trace() -> None:
    from specformer_train.trainer import _eager

    def traced_or_not(x: torch.Tensor) -> torch.Tensor:
        return x + (1.0 if torch.compiler.is_compiling() else 0.0)

    optimized = torch.compile(traced_or_not, backend="eager")
    with _eager():
        assert float(optimized(torch.zeros(1))) == 0.0  # run as plain Python
    assert float(optimized(torch.zeros(1))) == 1.0  # traced outside it


def test_only_the_main_process_exports_and_only_a_saved_checkpoint(tmp_path: Path) -> None:
    from specformer_train.parallel.layout import ParallelLayout

    trainer = make_trainer(tmp_path, steps=1)
    result = trainer.fit()
    (tmp_path / "model.safetensors").unlink()
    assert trainer._export_final(None) is None
    trainer.ctx = ParallelLayout(rank=1, world_size=2)
    assert trainer._export_final(result.checkpoint) is None and not (tmp_path / "model.safetensors").exists()


class FirstRowUnmasked(MaskedRows):
    """Rows whose even global rows count nothing at all, odd ones their even positions."""

    def loss_mask(self, first: int, count: int) -> np.ndarray:
        mask = super().loss_mask(first, count)
        mask[[(first + i) % 2 == 0 for i in range(count)]] = False
        return mask


def test_a_micro_batch_with_no_counted_target_adds_zero_not_nan(tmp_path: Path, recorder: Recorder) -> None:
    # Plain F.cross_entropy over only ignored targets is 0 / 0: the masked loss must say 0 instead.
    trainer = make_trainer(tmp_path, steps=1, batch_size=1, grad_accum=2)  # micro-batches of one row each
    trainer.train_rows = FirstRowUnmasked(np.random.default_rng(0).integers(0, 256, size=2000), seq_len=T, seed=0)
    trainer.fit()
    assert math.isfinite(recorder.steps[1]["loss"]) and recorder.steps[1]["loss"] > 0


def test_activation_checkpointing_wraps_every_block_and_trains_the_same(tmp_path: Path, recorder: Recorder) -> None:
    plain = make_trainer(tmp_path / "plain", steps=1)
    plain.fit()
    loss = recorder.steps[1]["loss"]
    recomputed = make_trainer(tmp_path / "recomputed", steps=1, activation_checkpointing=True)
    assert all(getattr(block, "_specformer_recompute", False) for block in recomputed.model.blocks)
    recomputed.fit()
    assert recorder.steps[1]["loss"] == pytest.approx(loss, rel=1e-6)
    for a, b in zip(plain.model.parameters(), recomputed.model.parameters()):
        assert torch.allclose(a, b, atol=1e-6)


def test_the_loggers_are_closed_with_the_runs_status(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    close = trainer_module.RunLoggers.close
    monkeypatch.setattr(trainer_module.RunLoggers, "close", lambda self, status: (seen.append(status), close(self, status)))
    make_trainer(tmp_path / "a", steps=1).fit()
    diverging = make_trainer(tmp_path / "b", steps=2)
    diverging.model.final_norm.register_forward_hook(NaNFrom(1))
    with pytest.raises(TrainingDiverged):
        diverging.fit()
    assert seen == ["finished", "diverged"]


def test_the_auxiliary_loss_is_added_to_the_objective_with_its_weight(tmp_path: Path) -> None:
    # A module's aux_loss (as an MoE router sets it in its forward) of sum(w^2) over the final norm's
    # weight: with aux_loss_weight 0.5 it adds 0.5 * 2w = 1 (w starts at 1) to that weight's gradient.
    grads: dict[bool, torch.Tensor] = {}
    for with_aux in (False, True):
        trainer = make_trainer(tmp_path / str(with_aux), steps=1, grad_clip=None, aux_loss_weight=0.5, val=False)
        norm = trainer.model.final_norm
        if with_aux:
            norm.register_forward_hook(lambda module, args, output: setattr(module, "aux_loss", (module.weight ** 2).sum()))
        spy = StepSpy(trainer)
        trainer.fit()
        grads[with_aux] = spy.grads[0]["final_norm.weight"]
    torch.testing.assert_close(grads[True] - grads[False], 0.5 * 2 * torch.ones(16))


def test_one_learning_rate_is_given_to_every_group_and_a_wrong_count_is_refused(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path)
    spy = StepSpy(trainer)
    assert len(trainer.optimizer.param_groups) == 2  # with weight decay and without
    trainer._train_step(3e-3)
    assert [group["lr"] for group in spy.groups[0]] == [3e-3, 3e-3]
    trainer._train_step([1e-3, 2e-3])
    assert [group["lr"] for group in spy.groups[1]] == [1e-3, 2e-3]
    with pytest.raises(ValueError):  # a schedule that forgets a group must not leave it at the last lr
        trainer._train_step([1e-3])


def test_a_nan_loss_found_after_ctrl_c_names_the_last_good_checkpoint(tmp_path: Path, recorder: Recorder) -> None:
    """Interrupted between log points: the steps still pending are read, and a NaN there names step 2's save."""
    trainer = make_trainer(tmp_path, steps=6, log_every=5, save_every=2)
    trainer.model.final_norm.register_forward_hook(NaNFrom(3))
    original = trainer._train_step

    def step_then_interrupt(lr: Any) -> Any:
        out = original(lr)
        if trainer.state.step == 2:  # the third step, before its increment
            os.kill(os.getpid(), signal.SIGINT)
        return out

    trainer._train_step = step_then_interrupt
    with pytest.raises(TrainingDiverged, match=r"became nan at step 3; training stopped and the last good checkpoint "
                                               rf"is {tmp_path / 'checkpoints' / 'step-0000002'} \(step 2\)"):
        trainer.fit()
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step-0000002"


def test_cuda_gets_bf16_where_supported_tf32_matmuls_and_compiling_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    assert _precision("auto", cuda) == "bf16" and _precision("auto", cpu) == "fp32"
    assert _precision("fp32", cuda) == "fp32"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)
    assert _precision("auto", cuda) == "fp32"
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32  # flags behind properties
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        _allow_tf32(cpu)
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        _allow_tf32(cuda)
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
    assert _compiles("auto", cuda) and not _compiles("auto", cpu)
    assert _compiles(True, cpu) and not _compiles(False, cuda)


def test_the_loop_hands_its_wrapper_and_context_to_gradient_sync_and_router_balancing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What only several processes could observe, pinned as the calls: no all-reduce before the last micro-batch."""
    syncs: list[tuple[Any, Any, bool]] = []
    balanced: list[tuple[Any, Any]] = []
    real_sync, real_balance = trainer_module.gradient_sync, trainer_module.balance_routers

    def sync(wrapped: Any, ctx: Any, *, sync: bool) -> Any:
        syncs.append((wrapped, ctx, sync))
        return real_sync(wrapped, ctx, sync=sync)

    def balance(model: Any, ctx: Any = None) -> int:
        balanced.append((model, ctx))
        return real_balance(model, ctx)

    monkeypatch.setattr(trainer_module, "gradient_sync", sync)
    monkeypatch.setattr(trainer_module, "balance_routers", balance)
    trainer = make_trainer(tmp_path, steps=2, grad_accum=3)
    trainer.fit()
    wrapped, ctx = trainer.wrapped, trainer.ctx
    assert syncs == [(wrapped, ctx, False), (wrapped, ctx, False), (wrapped, ctx, True)] * 2
    assert balanced == [(trainer.model, ctx)] * 2


def test_a_second_process_seeds_apart_reads_its_own_rows_and_leaves_reports_to_the_first(
        tmp_path: Path, recorder: Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 of 2, without a process group (mode none): its seed, its half of each global batch, and silence."""
    trainer = make_trainer(tmp_path, steps=2, sample_tokens=4, ctx=ParallelLayout(rank=1, world_size=2))
    seeds: list[int] = []
    real_seed = torch.manual_seed
    monkeypatch.setattr(torch, "manual_seed", lambda seed: seeds.append(seed) or real_seed(seed))
    saved: list[int] = []
    monkeypatch.setattr(trainer, "_save", lambda: saved.append(trainer.state.step) or tmp_path / "nowhere")
    seen = seen_inputs(trainer)
    sampled: list[int] = []
    monkeypatch.setattr(trainer_module, "sample_text", lambda *args, **kwargs: sampled.append(1) or "text")
    result = trainer.fit()
    assert seeds == [BASE["seed"] + 1]
    assert trainer.global_batch == 4 and trainer.state.world_size == 2
    for step, inputs in enumerate(seen):  # rows 2 and 3 of each global batch of 4
        assert torch.equal(inputs, torch.from_numpy(trainer.train_rows.rows(4 * step + 2, 2))[:, :-1])
    assert len(seen) == 2 and saved == [2]
    assert recorder.events == [] and sampled == []  # no hooks, no logs, no sample on rank 1
    assert result.model_path is None and not (tmp_path / "model.safetensors").exists()
    assert not (tmp_path / "metrics.jsonl").exists()  # the loggers run on the first process only
    assert trainer.sample(1) is None


def test_the_device_comes_from_the_config_unless_one_is_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[str, ParallelLayout]] = []
    monkeypatch.setattr(trainer_module, "device_for",
                        lambda setting, ctx: asked.append((setting, ctx)) or torch.device("cpu"))
    config = TrainSpec(**{**BASE, "device": "cpu"})
    model = specformer.build({"model": copy.deepcopy(MODEL), "train": BASE}, seed=0)
    rows = PackedRows(np.zeros(200, dtype=np.int64), seq_len=T, seed=0)
    ctx = ParallelLayout()
    chosen = Trainer(model=model, config=config, train_rows=rows, val_rows=None, tokenizer=ByteTokenizer(),
                     out_dir=tmp_path, ctx=ctx)
    assert asked == [("cpu", ctx)] and chosen.device == torch.device("cpu")
    Trainer(model=model, config=config, train_rows=rows, val_rows=None, tokenizer=ByteTokenizer(), out_dir=tmp_path,
            ctx=ctx, device="cpu")
    assert len(asked) == 1  # a given device is used as it is


def test_threads_are_chosen_and_set_only_for_the_cpu() -> None:
    assert _cpu_threads(3, torch.device("cpu")) == 3 and torch.get_num_threads() == 3
    assert _cpu_threads(5, torch.device("cuda")) is None and torch.get_num_threads() == 3


def test_bf16_autocasts_on_the_runs_device_type(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path, precision="bf16")
    trainer.device = torch.device("cuda")  # autocast's default dtype on CUDA is float16, not the bf16 asked for
    with pytest.warns(UserWarning, match="CUDA is not available"):
        context = trainer._autocast()
    assert context.device == "cuda" and context.fast_dtype == torch.bfloat16


def test_a_step_frees_the_gradients_so_an_unused_parameter_is_not_moved_next_step(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path)
    trainer._train_step(1e-2)
    assert all(p.grad is None for p in trainer.model.parameters())  # AdamW skips a parameter whose grad is None


def test_samples_only_when_asked_and_on_every_process_under_fsdp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(trainer_module, "sample_text", lambda model, tokenizer, **kw: calls.append(kw["max_new_tokens"])
                        or "text")
    assert make_trainer(tmp_path / "none", sample_tokens=0).sample(1) is None and calls == []
    trainer = make_trainer(tmp_path / "one", sample_tokens=1)
    assert trainer.sample(1) == "text" and calls == [1]
    trainer.ctx = ParallelLayout(mode="fsdp", rank=1, world_size=2)  # every process takes part in an FSDP forward
    assert trainer.sample(1) == "text" and calls == [1, 1]
    trainer.ctx = ParallelLayout(mode="ddp", rank=1, world_size=2)  # otherwise the first process samples alone
    assert trainer.sample(1) is None and calls == [1, 1]


def test_no_sample_text_prints_no_sample_block(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    make_trainer(tmp_path, steps=1, sample_tokens=0).fit()
    out = capsys.readouterr().out
    assert "step 1: val loss" in out and "sample" not in out


def test_an_evaluation_reads_the_pending_losses_first(tmp_path: Path, recorder: Recorder) -> None:
    make_trainer(tmp_path, steps=5, log_every=4, eval_every=2).fit()
    assert recorder.events == [("start", 0), ("step", 1), ("step", 2), ("eval", 2), ("step", 3), ("step", 4),
                               ("eval", 4), ("step", 5), ("eval", 5), ("saved", 5), ("end", 5)]


def test_ctrl_c_right_after_a_save_does_not_save_that_step_again(tmp_path: Path, recorder: Recorder) -> None:
    recorder.interrupt_at = 2
    result = make_trainer(tmp_path, steps=5, log_every=1, save_every=2).fit()
    assert result.status == "interrupted" and result.checkpoint == tmp_path / "checkpoints" / "step-0000002"
    assert [e for e in recorder.events if e[0] == "saved"] == [("saved", 2)]


def test_the_result_names_the_run_directory(tmp_path: Path) -> None:
    assert make_trainer(tmp_path / "run", steps=1).fit().out_dir == tmp_path / "run"


def test_a_fresh_run_starts_its_metrics_anew(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 1, "loss": 9.0}) + "\n")
    make_trainer(tmp_path, steps=1).fit()
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in metrics if r["kind"] == "train"] == [1] and metrics[0]["loss"] != 9.0


def test_utilisation_is_logged_against_the_devices_peak(tmp_path: Path, recorder: Recorder,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture) -> None:
    asked: list[tuple[torch.device, str]] = []
    monkeypatch.setattr(trainer_module, "peak_flops", lambda device, *, precision: asked.append((device, precision))
                        or 1e12)
    monkeypatch.setattr(trainer_module, "time", FakeClock())
    trainer = make_trainer(tmp_path, steps=2, log_every=2)
    trainer.fit()
    assert asked == [(torch.device("cpu"), "fp32")]
    rate = 2 * 2 * T / 0.5
    assert recorder.steps[2]["mfu"] == pytest.approx(rate * trainer.flops_per_token / 1e12)
    assert capsys.readouterr().err == ""  # progress: false draws no bar


class StreamingRows(PackedRows):
    """Rows whose place in their source is more than a row count (as a streamed corpus's is)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.restored: list[tuple[dict | None, int]] = []

    def position(self, sequences: int) -> dict:
        return {"file": 0, "offset": 10 * sequences}

    def restore(self, position: dict | None, *, sequences: int) -> None:
        self.restored.append((position, sequences))


def test_a_streams_place_is_saved_and_restored_on_resume(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path, steps=2)
    trainer.train_rows = StreamingRows(trainer.train_rows.tokens, seq_len=T, seed=0)
    result = trainer.fit()
    saved = json.loads((result.checkpoint / "trainer.json").read_text())
    assert saved["extra"]["stream"] == {"file": 0, "offset": 10 * 4}
    resumed = make_trainer(tmp_path, steps=3)
    resumed.train_rows = StreamingRows(resumed.train_rows.tokens, seq_len=T, seed=0)
    resumed.fit(resume_from=result.checkpoint)
    assert resumed.train_rows.restored == [({"file": 0, "offset": 40}, 4)]


def test_resuming_from_a_directory_restores_the_random_state(tmp_path: Path) -> None:
    make_trainer(tmp_path, steps=2).fit()
    expected = torch.get_rng_state()  # as saved with the final checkpoint
    resumed = make_trainer(tmp_path, steps=2)
    torch.manual_seed(123)
    resumed.fit(resume_from=str(tmp_path / "checkpoints" / "step-0000002"))  # finished: no step draws after it
    assert torch.equal(torch.get_rng_state(), expected)


def test_the_document_settings_come_from_the_config_fresh_and_resumed(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path, steps=1, document_mask=False, reset_positions=False)  # both default to true
    assert trainer.documents == {"document_mask": False, "reset_positions": False}
    trainer.fit()
    resumed = make_trainer(tmp_path, steps=2, document_mask=True, reset_positions=True)  # not the saved ones
    resumed.fit(resume_from=tmp_path / "checkpoints" / "step-0000001")
    assert resumed.documents == {"document_mask": True, "reset_positions": True}


class ShardedNorm:
    """What ``clip_grad_norm_`` returns under FSDP: a DTensor of this process' shard, whole through ``full_tensor``."""

    def __init__(self, full: torch.Tensor) -> None:
        self.full = full

    def full_tensor(self) -> torch.Tensor:
        return self.full


def test_under_fsdp_the_logged_norm_is_the_whole_models(tmp_path: Path, recorder: Recorder,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda parameters, max_norm: ShardedNorm(torch.tensor(7.0)))
    make_trainer(tmp_path, steps=1).fit()
    assert recorder.steps[1]["grad_norm"] == 7.0


def test_every_tensor_the_run_makes_is_on_its_device(tmp_path: Path, recorder: Recorder) -> None:
    """With meta as torch's default device, a tensor made without ``device=`` would not hold a value (see docs/testing)."""
    trainer = make_trainer(tmp_path, steps=2, save_every=1)
    with torch.device("meta"):
        result = trainer.fit()
    assert result.status == "finished" and math.isfinite(result.loss) and math.isfinite(result.val_loss)
    assert all(math.isfinite(r["loss"]) for r in recorder.steps.values())
