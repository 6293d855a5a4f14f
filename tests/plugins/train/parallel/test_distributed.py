"""Two processes on CPU (gloo), launched by torchrun, train like one process with the same global batch."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import yaml

import specformer
from specformer_train import train
from specformer_train.metrics import read_metrics

from ..conftest import make_text, tiny_train_spec

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with the gloo backend is not available")


def torchrun(spec: Path, out: Path, *extra: str, nproc: int = 2) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", "specformer.cli", "train", str(spec), "--out", str(out), *extra]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def train_alone(spec: Path, **kwargs: object) -> None:
    """``train(spec, **kwargs)`` in this process on one thread: the reference a multi-process run is compared with
    (each of its processes runs one thread)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(spec, **kwargs)
    finally:
        torch.set_num_threads(before)


def curve(out: Path) -> list[tuple[str, int]]:
    return [(r["kind"], r["step"]) for r in read_metrics(out / "metrics.jsonl")]


def values(out: Path) -> list[float]:
    return [r.get("loss", r.get("val_loss")) for r in read_metrics(out / "metrics.jsonl")]


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One process, batch 4: the reference."""
    root = tmp_path_factory.mktemp("distributed")
    corpus = root / "corpus.txt"
    corpus.write_text(make_text(6000, seed=2))
    settings = dict(data=str(corpus), steps=8, save_every=4, eval_every=4, seed=5, cache_dir=str(root / "cache"))
    (root / "one.yaml").write_text(yaml.safe_dump(tiny_train_spec(batch_size=4, **settings)))
    (root / "two.yaml").write_text(yaml.safe_dump(tiny_train_spec(batch_size=2, **settings)))  # per process
    train_alone(root / "one.yaml", out_dir=str(root / "single"))
    return root, root / "single"


@pytest.mark.slow  # the default suite keeps FSDP through test_optimizer_runs.py (muon-fsdp)
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_processes_match_one_with_the_same_global_batch(single, mode: str) -> None:
    root, reference = single
    out = root / mode
    done = torchrun(root / "two.yaml", out, "--set", f"train.distributed={mode}")
    assert "2 process(es)" in done.stdout and f"cpu, fp32, eager, {mode}" in done.stdout
    assert curve(out) == curve(reference)
    assert values(out) == pytest.approx(values(reference), abs=1e-5)
    ours, theirs = specformer.load(out / "model.safetensors"), specformer.load(reference / "model.safetensors")
    for (name, a), (_, b) in zip(ours.state_dict().items(), theirs.state_dict().items()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=name)


@pytest.fixture(scope="module")
def single_mtp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One process, batch 4, a model with two MTP depths, the second weighted 0 (it gets no gradient): the reference."""
    root = tmp_path_factory.mktemp("distributed-mtp")
    corpus = root / "corpus.txt"
    corpus.write_text(make_text(6000, seed=2))
    settings = dict(data=str(corpus), steps=4, save_every=2, eval_every=0, seed=5, cache_dir=str(root / "cache"))
    for name, batch in (("one", 4), ("two", 2)):
        spec = tiny_train_spec(batch_size=batch, **settings)
        spec["model"]["mtp"] = {"depths": 2, "loss_weights": [0.3, 0.0]}
        (root / f"{name}.yaml").write_text(yaml.safe_dump(spec))
    train_alone(root / "one.yaml", out_dir=str(root / "single"))
    return root, root / "single"


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_processes_train_mtp_depths_as_one(single_mtp, mode: str) -> None:
    root, reference = single_mtp
    out = root / mode
    torchrun(root / "two.yaml", out, "--set", f"train.distributed={mode}")
    mtp = [r["mtp_loss"] for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "train"]
    assert mtp == pytest.approx([r["mtp_loss"] for r in read_metrics(reference / "metrics.jsonl")
                                 if r["kind"] == "train"], abs=1e-5)
    assert values(out) == pytest.approx(values(reference), abs=1e-5)
    ours, theirs = specformer.load(out / "model.safetensors"), specformer.load(reference / "model.safetensors")
    for (name, a), (_, b) in zip(ours.state_dict().items(), theirs.state_dict().items()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.slow
def test_fsdp_resumes_mtp_training_from_a_full_checkpoint(single_mtp) -> None:
    root, reference = single_mtp
    out = root / "fsdp-resumed"
    (out / "checkpoints").mkdir(parents=True)
    shutil.copytree(reference / "checkpoints" / "step-0000002", out / "checkpoints" / "step-0000002")
    (out / "checkpoints" / "latest").write_text("step-0000002")
    torchrun(root / "two.yaml", out, "--set", "train.distributed=fsdp", "--resume")
    train = [r for r in read_metrics(reference / "metrics.jsonl") if r["kind"] == "train" and r["step"] > 2]
    resumed = [r for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in resumed] == [3, 4]
    for key in ("loss", "mtp_loss", "mtp_loss_1"):
        assert [r[key] for r in resumed] == pytest.approx([r[key] for r in train], abs=1e-5), key


@pytest.mark.slow
def test_fsdp_resumes_from_a_full_checkpoint(single) -> None:
    root, reference = single
    out = root / "fsdp-resumed"
    (out / "checkpoints").mkdir(parents=True)
    shutil.copytree(reference / "checkpoints" / "step-0000004", out / "checkpoints" / "step-0000004")
    (out / "checkpoints" / "latest").write_text("step-0000004")
    torchrun(root / "two.yaml", out, "--set", "train.distributed=fsdp", "--resume")
    assert curve(out) == [c for c in curve(reference) if c[1] > 4]
    tail = [v for c, v in zip(curve(reference), values(reference)) if c[1] > 4]
    assert values(out) == pytest.approx(tail, abs=1e-5)


@pytest.mark.slow
def test_a_refused_start_stops_every_process_at_once(single) -> None:
    # The reference run's directory holds an earlier run: the first process refuses to start, and
    # the second must stop too rather than wait at a barrier for the process group's timeout.
    root, reference = single
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               "-m", "specformer.cli", "train", str(root / "two.yaml"), "--out", str(reference)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode != 0
    assert "holds an earlier run" in done.stderr and "could not start the run" in done.stderr


@pytest.mark.slow
def test_two_processes_streaming_match_one(tmp_path: Path) -> None:
    """Each process reads the whole stream and keeps its slice of every global batch."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(12):
        (corpus / f"part-{i:02d}.txt").write_text(make_text(300, seed=10 + i))
    settings = dict(data=str(corpus), steps=6, save_every=3, eval_every=3, eval_steps=1, seed=5, streaming=True)
    (tmp_path / "one.yaml").write_text(yaml.safe_dump(tiny_train_spec(batch_size=4, **settings)))
    (tmp_path / "two.yaml").write_text(yaml.safe_dump(tiny_train_spec(batch_size=2, eval_steps=2, **{
        k: v for k, v in settings.items() if k != "eval_steps"})))  # the same 4 validation rows held out
    train_alone(tmp_path / "one.yaml", out_dir=str(tmp_path / "single"))
    torchrun(tmp_path / "two.yaml", tmp_path / "ddp", "--set", "train.distributed=ddp")
    assert curve(tmp_path / "ddp") == curve(tmp_path / "single")
    assert values(tmp_path / "ddp") == pytest.approx(values(tmp_path / "single"), abs=1e-5)
