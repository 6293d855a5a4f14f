"""Tensor parallelism on CPU: two gloo processes, launched by torchrun, split the components as their parallel_plan
declares (attention by heads, FFNs by hidden channels) and train like one process on the same global batch."""

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

#: Llama-like: RMSNorm, RoPE, grouped-query attention (4 query heads, 2 key/value heads) and SwiGLU, an output head
#: of its own (split by vocabulary: 259 byte tokens, 130 and 129 rows).
LLAMA_BLOCK = {"mixer": {"kind": "attention", "n_heads": 4, "n_kv_heads": 2}, "ffn": {"kind": "swiglu", "hidden": 64},
               "tie_embeddings": False}

#: Every part of attention the plan splits or keeps whole: gpt-oss's sinks (split by head), Qwen3's norm on each query
#: and key head and a value norm (kept whole, gradients summed), Qwen3-Next's output gate (split by head), and a
#: later layer reading the first one's keys and values (kv_from); a plain GELU MLP.
ATTENTION_PARTS_BLOCK = {
    "mixer": {"kind": "attention", "n_heads": 4, "n_kv_heads": 2, "sinks": True, "output_gate": True,
                  "qk_norm": {"kind": "rmsnorm"}, "v_norm": {"kind": "rmsnorm"}},
    "ffn": {"kind": "mlp", "hidden": 64},
    "layers": [{"select": 1, "mixer": {"kv_from": 0, "v_norm": None}}],
}

#: DeepSeek-V3's shape, tiny: latent attention with a query bottleneck, and a mixture with a shared expert and
#: sigmoid routing over groups (experts replicated under tp: expert parallelism is train.parallel.ep's).
DEEPSEEK_BLOCK = {
    "mixer": {"kind": "mla", "n_heads": 4, "q_lora_rank": 16, "kv_lora_rank": 16, "qk_rope_head_dim": 4,
                  "qk_nope_head_dim": 8, "v_head_dim": 8},
    "ffn": {"kind": "moe", "n_experts": 4, "top_k": 2, "hidden": 16, "n_shared_experts": 1,
            "router": {"kind": "sigmoid_topk", "normalize": True, "n_group": 2, "topk_group": 1}},
}


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])  # muon orthogonalises the gathered (rank-major) matrix
def test_two_tensor_parallel_processes_match_one(tmp_path: Path, optimizer: str) -> None:
    reference, two = one_and_parallel(tmp_path, LLAMA_BLOCK, optimizer=optimizer)
    out = tmp_path / "tp"
    done = torchrun(two, out, "--set", "train.parallel.tp=2")
    assert "cpu, fp32, eager, tp" in done.stdout
    assert ("tensor parallel 2 ways: split 2 CausalSelfAttention, 2 GatedMLP, embedding and head by vocabulary "
            "(each group of 2 processes") in done.stdout
    assert "declare(s) no tensor_parallel plan" not in done.stderr
    assert_same_run(out, reference)


@pytest.mark.slow
def test_a_component_without_a_plan_is_replicated_and_trains_like_one_process(tmp_path: Path) -> None:
    # A short convolution (LFM2's token mixer) declares no plan: it is computed whole on both processes, beside
    # a split FFN.
    reference, two = one_and_parallel(tmp_path, {**LLAMA_BLOCK, "mixer": {"kind": "short_conv"}})
    out = tmp_path / "tp"
    done = torchrun(two, out, "--set", "train.parallel.tp=2")
    assert "split 2 GatedMLP, embedding and head by vocabulary; replicated ShortConv (blocks.*.mixer)" in done.stdout
    assert done.stderr.count("ShortConv (blocks.*.mixer) declare(s) no parallel_plan") == 2  # once a process
    assert_same_run(out, reference)


#: Multi-query attention (one key/value head) over tp 2: each process holds a copy of the head, their gradients summed.
COPIED_KV_BLOCK = {**LLAMA_BLOCK, "mixer": {"kind": "attention", "n_heads": 4, "n_kv_heads": 1,
                                               "qkv_bias": True}}

#: DeepSeek-V3.2's sparse latent attention: each query reads its 8 best keys of up to 32; the indexer, whole on every
#: process, learns from the attention of every head (each process' heads' summed over the group).
SPARSE_MLA_BLOCK = {
    "mixer": {**DEEPSEEK_BLOCK["mixer"], "q_lora_rank": None,
                  "indexer": {"kind": "lightning", "topk": 8, "n_heads": 2, "head_dim": 8, "block": 8, "loss_coef": 1.0}},
    "ffn": {"kind": "swiglu", "hidden": 64},
}


@pytest.mark.slow
@pytest.mark.parametrize("block, split", [
    (ATTENTION_PARTS_BLOCK, "split 2 CausalSelfAttention, 2 MLP, embedding and head whole (tied)"),
    # the GatedMLPs: the mixtures' shared experts
    ({**DEEPSEEK_BLOCK, "tie_embeddings": False}, "split 2 GatedMLP, 2 LatentAttention, embedding and head by vocabulary"),
    (SPARSE_MLA_BLOCK, "split 2 GatedMLP, 2 LatentAttention, embedding and head whole (tied)"),
    (COPIED_KV_BLOCK, "split 2 CausalSelfAttention, 2 GatedMLP, embedding and head by vocabulary"),
], ids=["sinks-qknorm-gate-kvfrom", "mla-moe-shared-sigmoid", "mla-sparse-indexer", "mqa-copied-kv"])
def test_tensor_parallel_splits_every_declared_part_like_one_process(tmp_path: Path, block: dict, split: str) -> None:
    reference, two = one_and_parallel(tmp_path, block)
    out = tmp_path / "tp"
    done = torchrun(two, out, "--set", "train.parallel.tp=2")
    assert split in done.stdout
    assert "declare(s) no parallel_plan" not in done.stderr
    assert_same_run(out, reference)


#: Every kind of block part sequence parallelism treats apart: split attention (gathered on entry, its output
#: reduce-scattered), a split FFN, norms on this process' tokens, and a layer whose token mixer declares no plan
#: (gathered whole, its tokens of the output kept) with a mixture of experts computing on this process' tokens
#: (balanced by its bias: a load-balancing loss is taken on each process' tokens).
SEQUENCE_BLOCK = {
    **LLAMA_BLOCK,
    "layers": [{"select": 1, "mixer": {"kind": "short_conv"},
                "ffn": {"kind": "moe", "n_experts": 4, "top_k": 2, "hidden": 16, "n_shared_experts": 1,
                        "aux_loss_coef": 0.0,
                        "router": {"kind": "sigmoid_topk", "normalize": True, "n_group": 2, "topk_group": 1}}}],
}


@pytest.mark.slow
def test_sequence_parallelism_trains_like_one_process(tmp_path: Path) -> None:
    reference, two = one_and_parallel(tmp_path, SEQUENCE_BLOCK)
    out = tmp_path / "sp"
    done = torchrun(two, out, "--set", "train.parallel.tp=2", "--set", "train.parallel.sequence_parallel=true")
    assert ("split 1 CausalSelfAttention, 1 GatedMLP, embedding and head by vocabulary, the stream cut by sequence "
            "between sublayers; replicated ShortConv") in done.stdout
    assert_same_run(out, reference)


@pytest.mark.slow
def test_the_vocabulary_parallel_head_splits_logits_only_for_the_loss() -> None:
    script = Path(__file__).parent / "scripts" / "vocabulary_parallel_logits.py"
    tests = Path(__file__).parents[3]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script), str(tests)]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "rank 0: ok" in done.stdout and "rank 1: ok" in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("block", [LLAMA_BLOCK, COPIED_KV_BLOCK], ids=["gqa", "mqa-copied-kv"])
def test_tensor_parallel_resumes_from_a_one_process_checkpoint(tmp_path: Path, block: dict) -> None:
    # The full checkpoint is laid out for the split model (fused projections per part, a key/value head copied to
    # each process that reads it) and training goes on exactly as the one process did.
    reference, two = one_and_parallel(tmp_path, block)
    out = tmp_path / "tp-resumed"
    (out / "checkpoints").mkdir(parents=True)
    shutil.copytree(reference / "checkpoints" / "step-0000002", out / "checkpoints" / "step-0000002")
    (out / "checkpoints" / "latest").write_text("step-0000002")
    done = torchrun(two, out, "--set", "train.parallel.tp=2", "--resume")
    assert ("note: resuming a checkpoint written by processes 1, distributed none, dp 1, tp 1, ep 1, cp 1 onto "
            "processes 2, distributed tp, dp 1, tp 2, ep 1, cp 1") in done.stdout
    assert curve(out) == [c for c in curve(reference) if c[1] > 2]
    tail = [v for c, v in zip(curve(reference), values(reference)) if c[1] > 2]
    assert values(out) == pytest.approx(tail, abs=1e-5)
    assert_same_weights(out, reference)


@pytest.mark.slow
@pytest.mark.parametrize(("block", "sequence_parallel", "split"), [
    (LLAMA_BLOCK, False, "split 2 CausalSelfAttention, 2 GatedMLP, embedding and head by vocabulary"),
    (LLAMA_BLOCK, True, "split 2 CausalSelfAttention, 2 GatedMLP, embedding and head by vocabulary, the stream cut"),
    # the GatedMLPs: the mixtures' shared experts; balanced by bias alone, as a load-balancing loss is taken on each
    # data-parallel process' rows
    ({**DEEPSEEK_BLOCK, "ffn": {**DEEPSEEK_BLOCK["ffn"], "aux_loss_coef": 0.0}, "tie_embeddings": False}, False,
     "split 2 GatedMLP, 2 LatentAttention, embedding and head by vocabulary"),
], ids=["llama", "llama-sp", "mla-moe"])
def test_tensor_parallel_beside_fsdp_on_four_processes_matches_one(tmp_path: Path, block: dict, sequence_parallel: bool,
                                                                   split: str) -> None:
    # A 2 x 2 mesh: two tensor-parallel groups, FSDP2 across them, each group reading half of the global batch.
    reference, spec = one_and_parallel(tmp_path, block, per_process=2)
    out = tmp_path / "tp-fsdp"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4",
               "-m", "specformer.cli", "train", str(spec), "--out", str(out),
               "--set", "train.parallel.tp=2", "--set", "train.distributed=fsdp",
               "--set", f"train.parallel.sequence_parallel={str(sequence_parallel).lower()}"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "x 2 process(es)" in done.stdout and "cpu, fp32, eager, fsdp" in done.stdout
    assert split in done.stdout
    assert_same_run(out, reference)
