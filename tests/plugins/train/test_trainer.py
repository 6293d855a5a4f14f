"""The training loop, run in-process on a tiny model: learning, determinism, equivalences, outputs, failures."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

import specformer
from specformer.checkpoint.save_load import read_metadata
from specformer.registry.hookspecs import hookimpl
from specformer.registry.discovery import get_plugin_manager
from specformer.tokenizers.tokenizer import METADATA_KEY
from specformer_train import TrainingDiverged, train
from specformer_train.checkpointing import latest_checkpoint
from specformer_train.metrics import read_metrics
from specformer_train.trainer import Trainer

from .conftest import NaNFrom, tiny_spec


def run(out: Path, corpus: Path, **train_settings: Any) -> tuple[Any, list[dict]]:
    result = train(tiny_spec(data=str(corpus), out_dir=str(out), **train_settings))
    return result, read_metrics(out / "metrics.jsonl")


def losses(records: list[dict]) -> list[float]:
    return [r["loss"] for r in records if r["kind"] == "train"]


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


def test_seeded_runs_repeat_exactly(tmp_path: Path, corpus_dir: Path) -> None:
    _, a = run(tmp_path / "a", corpus_dir)
    _, b = run(tmp_path / "b", corpus_dir)
    assert losses(a) == losses(b)
    _, c = run(tmp_path / "c", corpus_dir, seed=7)
    assert losses(c) != losses(a)


def test_gradient_accumulation_equals_the_bigger_batch(tmp_path: Path, corpus_dir: Path) -> None:
    _, whole = run(tmp_path / "a", corpus_dir, batch_size=4, grad_accum=1)
    _, accumulated = run(tmp_path / "b", corpus_dir, batch_size=2, grad_accum=2)
    assert losses(accumulated) == pytest.approx(losses(whole), abs=1e-5)


def test_activation_checkpointing_changes_nothing_but_memory(tmp_path: Path, corpus_dir: Path) -> None:
    _, plain = run(tmp_path / "a", corpus_dir)
    _, recomputed = run(tmp_path / "b", corpus_dir, activation_checkpointing=True)
    assert losses(recomputed) == pytest.approx(losses(plain), abs=1e-6)


def test_resuming_from_a_checkpoint_continues_exactly(tmp_path: Path, corpus_dir: Path) -> None:
    _, uninterrupted = run(tmp_path / "a", corpus_dir, steps=8, save_every=4, eval_every=4)
    # A second run directory holding only the step-4 checkpoint, as if the run had died after it.
    partial = tmp_path / "b" / "checkpoints"
    partial.mkdir(parents=True)
    shutil.copytree(tmp_path / "a" / "checkpoints" / "step-0000004", partial / "step-0000004")
    (partial / "latest").write_text("step-0000004")
    (tmp_path / "b" / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in uninterrupted if r["step"] <= 4)
        + json.dumps({"kind": "train", "step": 5, "loss": 99.0}) + "\n"  # written after the checkpoint: dropped
    )
    result = train(tiny_spec(data=str(corpus_dir), out_dir=str(tmp_path / "b"), steps=8, save_every=4, eval_every=4),
                   resume=True)
    resumed = read_metrics(tmp_path / "b" / "metrics.jsonl")
    assert result.step == 8
    assert [(r["kind"], r["step"]) for r in resumed] == [(r["kind"], r["step"]) for r in uninterrupted]
    assert losses(resumed) == losses(uninterrupted)
    assert [r["val_loss"] for r in resumed if r["kind"] == "eval"] == [
        r["val_loss"] for r in uninterrupted if r["kind"] == "eval"]


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
        train(tiny_spec(data=str(corpus_dir), out_dir=str(tmp_path / "run"), batch_size=5000), overwrite=True)
    assert latest_checkpoint(tmp_path / "run").name == "step-0000008", "a failed start must not delete a run"
    capsys.readouterr()
    train(tiny_spec(data=str(corpus_dir), out_dir=str(tmp_path / "run"), steps=2, save_every=0, eval_every=0),
          overwrite=True)
    assert "--overwrite: removed 2 checkpoint(s) of the earlier run" in capsys.readouterr().out
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-0000002"]
    with pytest.raises(specformer.UserError, match=r"has no checkpoint to resume from"):
        train(tiny_spec(data=str(corpus_dir), out_dir=str(tmp_path / "empty")), resume=True)
    with pytest.raises(specformer.UserError, match=r"not a checkpoint directory"):
        train(tiny_spec(data=str(corpus_dir), out_dir=str(tmp_path / "run")), resume=str(tmp_path))
    with pytest.raises(specformer.UserError, match=r"give one of them"):
        train(tiny_spec(data=str(corpus_dir), out_dir=str(tmp_path / "run")), resume=True, overwrite=True)


def test_resuming_with_another_tokenizer_is_refused(tmp_path: Path, corpus_dir: Path) -> None:
    run(tmp_path / "run", corpus_dir, steps=2, save_every=0, eval_every=0)
    spec = tiny_spec(data=str(corpus_dir), out_dir=str(tmp_path / "run"), tokenizer="bpe")
    spec["model"]["vocab_size"] = 259
    with pytest.raises(specformer.CheckpointError, match="different tokenizer"):
        train(spec, resume=True)


def test_a_non_finite_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(
        tmp_path: Path, corpus_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    original_init = Trainer.__init__

    def init(self: Trainer, **kwargs: Any) -> None:
        original_init(self, **kwargs)
        self.model.final_norm.register_forward_hook(NaNFrom(6))

    monkeypatch.setattr(Trainer, "__init__", init)
    with pytest.raises(TrainingDiverged) as info:
        run(tmp_path / "run", corpus_dir, steps=8, save_every=4, eval_every=0)
    message = str(info.value)
    assert "became nan at step 6" in message and "step-0000004 (step 4)" in message
    root = tmp_path / "run" / "checkpoints"
    assert (root / "latest").read_text() == "step-0000004"
    assert not (root / "step-0000006").exists()
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [1, 2, 3, 4, 5]


def test_the_auxiliary_loss_is_added_to_the_objective(tmp_path: Path, corpus_dir: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    grads: dict[str, torch.Tensor] = {}
    original_init = Trainer.__init__

    def init(self: Trainer, **kwargs: Any) -> None:
        original_init(self, **kwargs)
        weight = self.model.final_norm.weight
        if aux_weight is not None:
            # An MoE layer would set this in its forward; the Decoder sums such tensors.
            def hook(module: torch.nn.Module, args: Any, output: torch.Tensor) -> None:
                module.aux_loss = (weight ** 2).sum()
            self.model.final_norm.register_forward_hook(hook)
        step = self.optimizer.step

        def capture(*a: Any, **k: Any) -> Any:
            grads.setdefault(str(aux_weight), weight.grad.detach().clone())
            return step(*a, **k)

        self.optimizer.step = capture

    monkeypatch.setattr(Trainer, "__init__", init)
    for aux_weight in (None, 0.5):
        run(tmp_path / str(aux_weight), corpus_dir, steps=1, grad_clip=None, eval_every=0, save_every=0,
            aux_loss_weight=0.5)
    expected_extra = 0.5 * 2 * torch.ones(32)  # d/dw of 0.5 * sum(w^2) at the initial w = 1
    torch.testing.assert_close(grads["0.5"] - grads["None"], expected_extra)


class _Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, int | str]] = []

    @hookimpl
    def specformer_on_train_start(self, out_dir: str) -> None:
        self.events.append(("start", Path(out_dir).name))

    @hookimpl
    def specformer_on_train_step(self, step: int, metrics: dict) -> None:
        assert {"loss", "lr", "tokens"} <= set(metrics)
        self.events.append(("step", step))

    @hookimpl
    def specformer_on_eval(self, step: int, metrics: dict) -> None:
        assert {"val_loss", "val_perplexity"} <= set(metrics)
        self.events.append(("eval", step))

    @hookimpl
    def specformer_on_checkpoint_saved(self, step: int, path: str) -> None:
        assert Path(path, "model.safetensors").is_file()
        self.events.append(("saved", step))

    @hookimpl
    def specformer_on_train_end(self, step: int, metrics: dict, out_dir: str) -> None:
        self.events.append(("end", step))


def test_training_events_reach_plugins(tmp_path: Path, corpus_dir: Path) -> None:
    recorder = _Recorder()
    pm = get_plugin_manager()
    pm.register(recorder, name="test-recorder")
    try:
        run(tmp_path / "run", corpus_dir, steps=4, eval_every=2, save_every=2)
    finally:
        pm.unregister(recorder)
    assert recorder.events == [("start", "run"), ("step", 1), ("step", 2), ("eval", 2), ("saved", 2), ("step", 3), ("step", 4),
                               ("eval", 4), ("saved", 4), ("end", 4)]


def test_log_every_batches_reads_without_losing_steps(tmp_path: Path, corpus_dir: Path) -> None:
    _, every = run(tmp_path / "a", corpus_dir)
    _, batched = run(tmp_path / "b", corpus_dir, log_every=3)
    assert losses(batched) == losses(every)
    train_records = [r for r in batched if r["kind"] == "train"]
    # read back every 3 steps and before step 4's evaluation and save: windows 1-3, 4, 5-7, 8
    assert [("tokens_per_s" in r) for r in train_records] == [False, False, True, True, False, False, True, True]
    assert [r["tokens"] for r in train_records] == [r["tokens"] for r in every if r["kind"] == "train"]
    assert [r["grad_norm"] for r in train_records] == [r["grad_norm"] for r in every if r["kind"] == "train"]


def test_samples_use_the_generate_plugin_without_changing_training(tmp_path: Path, corpus_dir: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("specformer_generate")
    _, quiet = run(tmp_path / "a", corpus_dir, sample_tokens=0)
    capsys.readouterr()
    _, sampled = run(tmp_path / "b", corpus_dir, sample_tokens=12, sample_prompt="the ")
    out = capsys.readouterr().out
    assert out.count("--- sample at step") == 2 and "\nthe " in out
    assert losses(sampled) == losses(quiet)


def test_bf16_autocast_runs_on_request_and_changes_the_numbers(tmp_path: Path, corpus_dir: Path) -> None:
    _, fp32 = run(tmp_path / "a", corpus_dir, steps=3, eval_every=0)
    _, bf16 = run(tmp_path / "b", corpus_dir, steps=3, eval_every=0, precision="bf16")
    assert losses(bf16) == pytest.approx(losses(fp32), abs=0.05)  # the same training, rounded to bf16
    assert losses(bf16) != losses(fp32)


@pytest.mark.slow
def test_compiled_training_matches_eager(tmp_path: Path, corpus_dir: Path) -> None:
    _, eager = run(tmp_path / "a", corpus_dir)
    _, compiled = run(tmp_path / "b", corpus_dir, compile=True)
    assert losses(compiled) == pytest.approx(losses(eager), abs=1e-4)


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
