"""Every built-in optimizer in real runs: exact resume after SIGKILL, and two processes (DDP, FSDP2)
training like one with the same global batch. AdamW is covered by test_interrupts / test_distributed."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import yaml

import specformer
from specformer.errors import CheckpointError
from specformer_train import train
from specformer_train.metrics import read_metrics

from .conftest import make_text, tiny_train_spec
from .parallel.test_distributed import torchrun
from .test_interrupts import cli, curve

OPTIMIZERS = {
    "muon": {"kind": "muon", "lr": 0.02},
    "lion": {"kind": "lion"},
    "sgd": {"kind": "sgd", "momentum": 0.9, "nesterov": True},
}
# Muon in the default suite; Lion and SGD (no cross-process arithmetic of their own) only in the slow one.
SLOW = {"lion", "sgd"}


def marked(names: list[str]) -> list:
    return [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in names]


def spec_file(root: Path, name: str, **settings) -> Path:
    corpus = root / "corpus.txt"
    if not corpus.exists():
        corpus.write_text(make_text(6000, seed=3))
    data = tiny_train_spec(data=str(corpus), optimizer=OPTIMIZERS[name], **settings)
    path = root / f"{name}-{settings.get('batch_size', 4)}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# AdamW's kill-and-resume is test_interrupts.py's; these, the other optimizers', run in the slow suite too.
@pytest.mark.slow
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_sigkill_then_resume_matches_the_uninterrupted_run(tmp_path: Path, name: str) -> None:
    spec = spec_file(tmp_path, name, steps=10, save_every=4, eval_every=4)
    done = cli(spec, tmp_path / "uninterrupted")
    assert done.returncode == 0, done.stderr
    expected = curve(tmp_path / "uninterrupted")
    out = tmp_path / "killed"
    killed = cli(spec, out, env={"KILL_MODE": "step", "KILL_AT": "6", "KILL_SIGNAL": "SIGKILL"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert (out / "checkpoints" / "latest").read_text() == "step-0000004"
    resumed = cli(spec, out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert curve(out) == expected  # every loss and validation loss, exactly: the optimizer state came back


def test_resuming_with_another_optimizer_is_refused(tmp_path: Path) -> None:
    spec = yaml.safe_load(spec_file(tmp_path, "muon", steps=2, save_every=2, eval_every=0).read_text())
    train(spec, out_dir=str(tmp_path / "run"))
    spec["train"].update(steps=4, optimizer={"kind": "adamw"})
    with pytest.raises(CheckpointError, match="trained with the optimizer Muon.*builds AdamW"):
        train(spec, out_dir=str(tmp_path / "run"), resume=True)
    # Layer 0's parameters in groups of their own: 5 groups where the run saved 3.
    spec["train"]["optimizer"] = {"kind": "muon", "groups": [{"match": ["blocks.0.*"], "lr_scale": 0.5}]}
    with pytest.raises(CheckpointError, match="has 3 parameter groups, this spec's train.optimizer makes 5"):
        train(spec, out_dir=str(tmp_path / "run"), resume=True)


needs_gloo = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with the gloo backend is not available")


@needs_gloo
@pytest.mark.slow  # two processes each (7 s): with the other multi-process runs, in the slow suite
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])  # DDP: only gradients are shared
@pytest.mark.parametrize("name", marked(list(OPTIMIZERS)))
def test_two_processes_match_one(tmp_path: Path, name: str, mode: str) -> None:
    settings = dict(steps=6, save_every=3, eval_every=3, seed=5)
    one = spec_file(tmp_path, name, batch_size=4, **settings)
    two = spec_file(tmp_path, name, batch_size=2, **settings)  # per process: the same global batch
    train(one, out_dir=str(tmp_path / "single"))
    torchrun(two, tmp_path / mode, "--set", f"train.distributed={mode}")
    reference = read_metrics(tmp_path / "single" / "metrics.jsonl")
    ours = read_metrics(tmp_path / mode / "metrics.jsonl")
    assert [(r["kind"], r["step"]) for r in ours] == [(r["kind"], r["step"]) for r in reference]
    values = [r.get("loss", r.get("val_loss")) for r in ours]
    assert values == pytest.approx([r.get("loss", r.get("val_loss")) for r in reference], abs=1e-5)
    a = specformer.load(tmp_path / mode / "model.safetensors").state_dict()
    b = specformer.load(tmp_path / "single" / "model.safetensors").state_dict()
    for key in b:
        torch.testing.assert_close(a[key], b[key], atol=1e-5, rtol=1e-4, msg=key)
