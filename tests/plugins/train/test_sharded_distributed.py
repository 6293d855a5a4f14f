"""Sharded checkpoints across processes (gloo, CPU): FSDP2 and tensor-parallel runs write their shares, and a run
resumed from one on another mesh (more processes, one process, tensor parallelism) continues exactly as the
uninterrupted run on one process."""

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

from .conftest import TINY_MODEL, TINY_TRAIN, make_text
from .parallel.test_distributed import curve, train_alone, values
from .test_sharded_checkpoint import assert_no_pickle

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                 reason="torch.distributed with the gloo backend is not available")]

#: Grouped-query attention: the fused qkv projection's rows are rank-major when split by tensor parallelism.
MODEL = {**TINY_MODEL, "block": {**TINY_MODEL["block"], "mixer": {"kind": "attention", "n_heads": 4, "n_kv_heads": 2},
                                 "ffn": {"kind": "swiglu", "hidden": 64}}}


def launch(spec: Path, out: Path, processes: int, *extra: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
               "-m", "specformer.cli", "train", str(spec), "--out", str(out), *extra]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def resume_from(run: Path, out: Path, step: int = 2) -> Path:
    """``out`` holding only ``run``'s checkpoint of ``step``, named by ``latest``."""
    name = f"step-{step:07d}"
    (out / "checkpoints").mkdir(parents=True)
    shutil.copytree(run / "checkpoints" / name, out / "checkpoints" / name)
    (out / "checkpoints" / "latest").write_text(name)
    return out


def assert_continues(out: Path, reference: Path, *, after: int = 2) -> None:
    assert curve(out) == [c for c in curve(reference) if c[1] > after]
    tail = [v for c, v in zip(curve(reference), values(reference)) if c[1] > after]
    assert values(out) == pytest.approx(tail, abs=1e-5)
    ours, theirs = specformer.load(out / "model.safetensors"), specformer.load(reference / "model.safetensors")
    for (name, a), (_, b) in zip(ours.state_dict().items(), theirs.state_dict().items()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=name)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference on one process (batch 4, full checkpoints) and specs for 1, 2 and 4 processes sharing its batch."""
    root = tmp_path_factory.mktemp("sharded")
    corpus = root / "corpus.txt"
    corpus.write_text(make_text(4000, seed=3))
    settings = {**TINY_TRAIN, "data": str(corpus), "steps": 4, "save_every": 2, "eval_every": 2, "seed": 7,
                "cache_dir": str(root / "cache"), "checkpoint_format": "sharded"}
    for batch in (1, 2, 4):  # per process
        (root / f"batch{batch}.yaml").write_text(yaml.safe_dump({"model": MODEL, "train": {**settings,
                                                                                           "batch_size": batch}}))
    (root / "full.yaml").write_text(yaml.safe_dump({"model": MODEL, "train": {**settings, "batch_size": 4,
                                                                              "checkpoint_format": "full"}}))
    train_alone(root / "full.yaml", out_dir=str(root / "single"))
    # FSDP2 on two processes, sharded checkpoints at steps 2 and 4
    launch(root / "batch2.yaml", root / "fsdp", 2, "--set", "train.distributed=fsdp")
    return root


def test_fsdp_writes_one_shard_per_process_and_no_pickle(runs: Path) -> None:
    checkpoint = runs / "fsdp" / "checkpoints" / "step-0000002"
    names = sorted(p.name for p in checkpoint.iterdir())
    assert names == ["rng-rank0.safetensors", "rng-rank1.safetensors", "shard-rank00000.safetensors",
                     "shard-rank00001.safetensors", "sharded.json", "tokenizer.json", "trainer.json"]
    assert_no_pickle(checkpoint)
    assert_continues(runs / "fsdp", runs / "single", after=0)  # the run itself, and its consolidated final model


def test_fsdp_sharded_checkpoint_resumes_on_four_processes(runs: Path) -> None:
    out = resume_from(runs / "fsdp", runs / "four")
    launch(runs / "batch1.yaml", out, 4, "--set", "train.distributed=fsdp", "--resume")
    assert_continues(out, runs / "single")


def test_fsdp_sharded_checkpoint_resumes_on_one_process(runs: Path) -> None:
    out = resume_from(runs / "fsdp", runs / "one")
    train_alone(runs / "batch4.yaml", out_dir=str(out), resume=True)
    assert_continues(out, runs / "single")


def test_tensor_parallel_sharded_checkpoint_resumes_on_one_process_and_fsdp_onto_tensor_parallel(runs: Path) -> None:
    # Saved by tensor parallelism, the fused qkv's rows are stored in the module's order: one process reads them as
    # its own; and FSDP's checkpoint is split again by heads for a tensor-parallel run.
    launch(runs / "batch4.yaml", runs / "tp", 2, "--set", "train.parallel.tp=2")
    assert_no_pickle(runs / "tp" / "checkpoints" / "step-0000002")
    out = resume_from(runs / "tp", runs / "tp-to-one")
    train_alone(runs / "batch4.yaml", out_dir=str(out), resume=True)
    assert_continues(out, runs / "single")
    out = resume_from(runs / "fsdp", runs / "fsdp-to-tp")
    launch(runs / "batch4.yaml", out, 2, "--set", "train.parallel.tp=2", "--resume")
    assert_continues(out, runs / "single")


def test_tensor_parallel_beside_fsdp_sharded_checkpoint_resumes_on_one_process(runs: Path) -> None:
    # A 2 x 2 mesh: FSDP2 shards the split rows again (a _StridedShard), replicated weights live on the dp sub-meshes.
    launch(runs / "batch2.yaml", runs / "tp-fsdp", 4, "--set", "train.parallel.tp=2", "--set", "train.distributed=fsdp")
    assert_no_pickle(runs / "tp-fsdp" / "checkpoints" / "step-0000002")
    assert_continues(runs / "tp-fsdp", runs / "single", after=0)
    out = resume_from(runs / "tp-fsdp", runs / "tp-fsdp-to-one")
    train_alone(runs / "batch4.yaml", out_dir=str(out), resume=True)
    assert_continues(out, runs / "single")


def test_copied_key_value_heads_are_stored_once_and_resume_on_one_process(runs: Path) -> None:
    # tp 4 over 2 key/value heads: two processes hold a copy of each head; the checkpoint keeps the module's rows.
    launch(runs / "batch4.yaml", runs / "tp4", 4, "--set", "train.parallel.tp=4")
    assert_no_pickle(runs / "tp4" / "checkpoints" / "step-0000002")
    assert_continues(runs / "tp4", runs / "single", after=0)
    out = resume_from(runs / "tp4", runs / "tp4-to-one")
    train_alone(runs / "batch4.yaml", out_dir=str(out), resume=True)
    assert_continues(out, runs / "single")
