"""An adapter run on two processes (gloo, torchrun) trains like one process with the same global batch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import yaml

import specformer
from specformer_train import train

from .conftest import tiny_spec

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with the gloo backend is not available")

ADAPTER = {"kind": "lora", "rank": 4, "alpha": 8, "targets": ["blocks.*.attention.qkv", "blocks.*.ffn.*"]}


@pytest.mark.slow  # two torchrun launches, ~30 s each
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_processes_train_the_adapter_like_one(tmp_path: Path, base_ckpt: Path, text_file: Path, mode: str) -> None:
    settings = dict(data=str(text_file), steps=4, save_every=2, eval_every=2, seed=5, adapter=ADAPTER,
                    init=str(base_ckpt), cache_dir=str(tmp_path / "cache"))
    (tmp_path / "one.yaml").write_text(yaml.safe_dump(tiny_spec(batch_size=4, **settings)))
    (tmp_path / "two.yaml").write_text(yaml.safe_dump(tiny_spec(batch_size=2, **settings)))
    train(tmp_path / "one.yaml", out_dir=str(tmp_path / "single"))

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
               "specformer.cli", "train", str(tmp_path / "two.yaml"), "--out", str(tmp_path / mode),
               "--set", f"train.distributed={mode}"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 process(es)" in done.stdout and "trains  " in done.stdout

    ours = specformer.load(tmp_path / mode / "model.safetensors").state_dict()
    reference = specformer.load(tmp_path / "single" / "model.safetensors").state_dict()
    assert ours.keys() == reference.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], reference[name], atol=1e-5, rtol=1e-4, msg=name)
