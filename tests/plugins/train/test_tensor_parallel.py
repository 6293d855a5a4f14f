"""Tensor parallelism on CPU: two gloo processes, launched by torchrun, split the components that declare a plan
(attention by heads, FFNs by hidden channels) and train like one process on the same global batch."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from .parallel_runs import assert_same_run, assert_same_weights, one_and_parallel
from .test_distributed import curve, torchrun, values

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with the gloo backend is not available")

#: Llama-like: RMSNorm, RoPE, grouped-query attention (4 query heads, 2 key/value heads) and SwiGLU.
LLAMA_BLOCK = {"attention": {"kind": "attention", "n_heads": 4, "n_kv_heads": 2}, "ffn": {"kind": "swiglu", "hidden": 64}}


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])  # muon orthogonalises the gathered (rank-major) matrix
def test_two_tensor_parallel_processes_match_one(tmp_path: Path, optimizer: str) -> None:
    reference, two = one_and_parallel(tmp_path, LLAMA_BLOCK, optimizer=optimizer)
    out = tmp_path / "tp"
    done = torchrun(two, out, "--set", "train.parallel.tp=2")
    assert "cpu, fp32, eager, tp" in done.stdout
    assert "tensor parallel 2 ways: split 2 CausalSelfAttention, 2 GatedMLP (each group of 2 processes" in done.stdout
    assert "declare(s) no tensor_parallel plan" not in done.stderr
    assert_same_run(out, reference)


@pytest.mark.slow
def test_a_component_without_a_plan_is_replicated_and_trains_like_one_process(tmp_path: Path) -> None:
    # A mixture of experts declares no plan: it is computed whole on both processes, beside split attention.
    moe = {"kind": "moe", "n_experts": 4, "top_k": 2, "hidden": 16}
    reference, two = one_and_parallel(tmp_path, {**LLAMA_BLOCK, "ffn": moe})
    out = tmp_path / "tp"
    done = torchrun(two, out, "--set", "train.parallel.tp=2")
    assert "split 2 CausalSelfAttention; replicated MoE (blocks.*.ffn)" in done.stdout
    assert done.stderr.count("MoE (blocks.*.ffn) declare(s) no tensor_parallel plan") == 2  # once a process
    assert_same_run(out, reference)


@pytest.mark.slow
def test_tensor_parallel_resumes_from_a_one_process_checkpoint(tmp_path: Path) -> None:
    # The full checkpoint is laid out for the split model (fused projections per part) and training goes on
    # exactly as the one process did.
    reference, two = one_and_parallel(tmp_path, LLAMA_BLOCK)
    out = tmp_path / "tp-resumed"
    (out / "checkpoints").mkdir(parents=True)
    shutil.copytree(reference / "checkpoints" / "step-0000002", out / "checkpoints" / "step-0000002")
    (out / "checkpoints" / "latest").write_text("step-0000002")
    torchrun(two, out, "--set", "train.parallel.tp=2", "--resume")
    assert curve(out) == [c for c in curve(reference) if c[1] > 2]
    tail = [v for c, v in zip(curve(reference), values(reference)) if c[1] > 2]
    assert values(out) == pytest.approx(tail, abs=1e-5)
    assert_same_weights(out, reference)


@pytest.mark.slow
def test_tensor_parallel_beside_fsdp_on_four_processes_matches_one(tmp_path: Path) -> None:
    # A 2 x 2 mesh: two tensor-parallel groups, FSDP2 across them, each group reading half of the global batch.
    reference, spec = one_and_parallel(tmp_path, LLAMA_BLOCK, per_process=2)
    out = tmp_path / "tp-fsdp"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4",
               "-m", "specformer.cli", "train", str(spec), "--out", str(out),
               "--set", "train.parallel.tp=2", "--set", "train.distributed=fsdp"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "x 2 process(es)" in done.stdout and "cpu, fp32, eager, fsdp" in done.stdout
    assert "split 2 CausalSelfAttention, 2 GatedMLP (each group of 2 processes" in done.stdout
    assert_same_run(out, reference)
