"""An adapter run on two processes (gloo, torchrun) trains like one process with the same global batch, and an
FSDP2 adapter run resumes from its own checkpoint as if it had not stopped."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import yaml
from safetensors import safe_open

import specformer
from specformer.checkpoint.save_load import read_metadata
from specformer_finetune.adapter_file import base_reference
from specformer_train import train
from specformer_train.metrics import read_metrics

from .conftest import tiny_finetune_spec

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with the gloo backend is not available")

ADAPTER = {"kind": "lora", "rank": 4, "alpha": 8, "targets": ["blocks.*.mixer.qkv", "blocks.*.ffn.*"]}


@pytest.mark.slow  # two torchrun launches, ~30 s each
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_processes_train_the_adapter_like_one(tmp_path: Path, base_ckpt: Path, text_file: Path, mode: str) -> None:
    settings = dict(data=str(text_file), steps=4, save_every=2, eval_every=2, seed=5, adapter=ADAPTER,
                    init=str(base_ckpt), cache_dir=str(tmp_path / "cache"))
    (tmp_path / "one.yaml").write_text(yaml.safe_dump(tiny_finetune_spec(batch_size=4, **settings)))
    (tmp_path / "two.yaml").write_text(yaml.safe_dump(tiny_finetune_spec(batch_size=2, **settings)))
    train(tmp_path / "one.yaml", out_dir=str(tmp_path / "single"))

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
               "specformer.cli.main", "train", str(tmp_path / "two.yaml"), "--out", str(tmp_path / mode),
               "--set", f"train.distributed={mode}"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 process(es)" in done.stdout and "trains  " in done.stdout

    ours = specformer.load(tmp_path / mode / "model.safetensors").state_dict()
    reference = specformer.load(tmp_path / "single" / "model.safetensors").state_dict()
    assert ours.keys() == reference.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], reference[name], atol=1e-5, rtol=1e-4, msg=name)


def _torchrun(spec: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
               "specformer.cli.main", "train", str(spec), "--out", str(out), "--set", "train.distributed=fsdp", *extra]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _losses(out: Path) -> list[tuple[str, int, float]]:
    return [(r["kind"], r["step"], r.get("loss", r.get("val_loss"))) for r in read_metrics(out / "metrics.jsonl")]


@pytest.mark.slow  # two torchrun launches, ~20-30 s each; the default suite resumes an adapter run in one process
def test_fsdp_adapter_run_resumes_from_its_checkpoint(tmp_path: Path, base_ckpt: Path, text_file: Path) -> None:
    settings = dict(data=str(text_file), steps=4, save_every=2, eval_every=2, seed=5, adapter=ADAPTER,
                    init=str(base_ckpt), cache_dir=str(tmp_path / "cache"))
    spec = tmp_path / "two.yaml"
    spec.write_text(yaml.safe_dump(tiny_finetune_spec(batch_size=2, **settings)))
    _torchrun(spec, tmp_path / "whole")

    # What the FSDP run saved at step 2: the adapter's tensors only, and the base checkpoint it sits on.
    saved = tmp_path / "whole" / "checkpoints" / "step-0000002"
    with safe_open(str(saved / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        stored = {k: f.get_tensor(k) for k in keys}
    model = specformer.load(base_ckpt)
    lora = {f"{t}.{leaf}" for t in ("blocks.0.mixer.qkv", "blocks.1.mixer.qkv", "blocks.0.ffn.gate_up",
                                    "blocks.1.ffn.gate_up", "blocks.0.ffn.down", "blocks.1.ffn.down")
            for leaf in ("lora_A", "lora_B")}
    assert keys == lora
    assert stored["blocks.0.ffn.down.lora_B"].shape == (model.blocks[0].ffn.down.out_features, 4)  # full, not a shard
    header = json.loads(read_metadata(saved / "model.safetensors")["adapter"])
    assert {k: header["base"][k] for k in ("path", "sha256")} == base_reference(base_ckpt)
    with safe_open(str(saved / "optimizer.safetensors"), "pt") as f:  # AdamW's state: the adapter's, whole
        state = {k: f.get_slice(k).get_shape() for k in f.keys()}
    assert {k.rsplit("/", 1)[0] for k in state} == lora
    assert all(state[f"{name}/exp_avg"] == list(stored[name].shape) for name in lora)

    # The run stopped there: a new FSDP launch resumes it from that checkpoint alone.
    (tmp_path / "resumed" / "checkpoints").mkdir(parents=True)
    shutil.copytree(saved, tmp_path / "resumed" / "checkpoints" / "step-0000002")
    (tmp_path / "resumed" / "checkpoints" / "latest").write_text("step-0000002")
    _torchrun(spec, tmp_path / "resumed", "--resume")

    tail = [r for r in _losses(tmp_path / "whole") if r[1] > 2]
    resumed = _losses(tmp_path / "resumed")
    assert [r[:2] for r in resumed] == [r[:2] for r in tail] and tail
    assert [r[2] for r in resumed] == pytest.approx([r[2] for r in tail], abs=1e-6)
    a = specformer.load(tmp_path / "whole" / "model.safetensors").state_dict()
    b = specformer.load(tmp_path / "resumed" / "model.safetensors").state_dict()
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-6, rtol=1e-6, msg=name)
