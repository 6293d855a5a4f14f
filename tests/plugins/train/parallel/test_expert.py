"""Expert parallelism on CPU: gloo processes, launched by torchrun, read different rows, each holds half of every
mixture's experts and sends tokens to their experts' processes, and train like one process on the same global
batch."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import specformer

from .parallel_runs import assert_same_run, assert_same_weights, one_and_parallel
from .test_distributed import curve, torchrun, values

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with the gloo backend is not available")

#: DeepSeek-like: sigmoid routing balanced by bias, normalised weights, and a shared expert beside 4 routed ones.
DEEPSEEK_MOE = {"ffn": {"kind": "moe", "n_experts": 4, "top_k": 2, "hidden": 16, "n_shared_experts": 1,
                        "router": {"kind": "sigmoid_topk", "normalize": True, "scaling_factor": 2.0,
                                   "bias_update_rate": 0.01},
                        "aux_loss_coef": 0.0}}  # balanced by bias: a per-process auxiliary loss is not the global one

#: The other paths: the router's weights scale the experts' inputs (Llama 4), plain (ungated) experts with biases
#: (gpt-oss), one expert per token and a gated shared expert (Qwen2-MoE).
INPUT_WEIGHTED_MOE = {"ffn": {"kind": "moe", "n_experts": 4, "top_k": 1, "hidden": 16, "gated": False,
                              "activation": "gelu", "expert_bias": True, "n_shared_experts": 1, "shared_gate": True,
                              "router": {"kind": "topk_sigmoid"}, "aux_loss_coef": 0.0}}


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The one-process reference run of the DeepSeek-like mixture, and the spec of 2 rows a process."""
    return one_and_parallel(tmp_path_factory.mktemp("expert-parallel"), DEEPSEEK_MOE, per_process=2)


def _reference_and_spec(deepseek: tuple[Path, Path], tmp_path: Path, block: dict) -> tuple[Path, Path]:
    return deepseek if block is DEEPSEEK_MOE else one_and_parallel(tmp_path, block, per_process=2)


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "accumulate", "block"), [("ddp", 1, DEEPSEEK_MOE), ("fsdp", 1, DEEPSEEK_MOE),
                                                           ("ddp", 2, DEEPSEEK_MOE), ("ddp", 1, INPUT_WEIGHTED_MOE)],
                         ids=["ddp", "fsdp", "ddp-accumulating", "ddp-input-weighted"])
def test_two_expert_parallel_processes_match_one(deepseek, tmp_path: Path, mode: str, accumulate: int,
                                                 block: dict) -> None:
    # accumulating: the expert gradients are finished once, after the last micro-batch
    reference, two = _reference_and_spec(deepseek, tmp_path, block)
    out = tmp_path / "ep"
    done = torchrun(two, out, "--set", "train.parallel.ep=2", "--set", f"train.distributed={mode}",
                    "--set", f"train.batch_size={2 // accumulate}", "--set", f"train.grad_accum={accumulate}",
                    "--set", f"train.eval_steps={2 * accumulate}",
                    "--set", "train.sample_tokens=3")  # eval_steps: the reference's 8 validation rows
    assert f"cpu, fp32, eager, {mode}" in done.stdout and "x 2 process(es)" in done.stdout
    assert "split   expert parallel 2 ways: split 2 MoE, 2 of 4 experts on each process" in done.stdout
    assert "--- sample at step 2 ---" in done.stdout  # every process takes part in sampling's forwards
    assert_same_run(out, reference)
    # the saved checkpoint holds every expert, loadable on one process
    saved = specformer.load(out / "checkpoints" / "step-0000004" / "model.safetensors")
    assert saved.blocks[0].ffn.experts_in.shape[0] == 4


@pytest.mark.slow
def test_two_replicas_of_two_expert_parallel_processes_match_one(deepseek, tmp_path: Path) -> None:
    # 4 processes: experts 0-1 on ranks 0 and 2, experts 2-3 on ranks 1 and 3, each reading a quarter of the batch.
    # Under FSDP2 (the replicas' all-reduce is the same code beside DDP, whose ignoring is tested above).
    reference, spec = deepseek
    out = tmp_path / "ep-replicas"
    done = torchrun(spec, out, "--set", "train.parallel.ep=2", "--set", "train.distributed=fsdp",
                    "--set", "train.batch_size=1", nproc=4)
    assert "x 4 process(es)" in done.stdout
    assert_same_run(out, reference)


@pytest.mark.slow
def test_expert_parallel_resumes_from_its_own_checkpoint(deepseek, tmp_path: Path) -> None:
    # The step-2 checkpoint of an expert-parallel run is the one process' (all experts, its moments): a resumed
    # expert-parallel run cuts its experts from it again and goes on exactly as the one process did.
    reference, two = deepseek
    first = tmp_path / "ep"
    # stopped at step 2 (within the 2 warm-up steps, so the learning rates so far are the 4-step run's)
    torchrun(two, first, "--set", "train.parallel.ep=2", "--set", "train.steps=2")
    assert_same_weights(first / "checkpoints" / "step-0000002", reference / "checkpoints" / "step-0000002")
    optimizer_state = _tensors(first / "checkpoints" / "step-0000002" / "optimizer.safetensors")
    expected = _tensors(reference / "checkpoints" / "step-0000002" / "optimizer.safetensors")
    assert optimizer_state.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(optimizer_state[name], tensor, atol=1e-5, rtol=1e-4, msg=name)
    torchrun(two, first, "--set", "train.parallel.ep=2", "--resume")
    assert curve(first) == curve(reference)
    assert values(first) == pytest.approx(values(reference), abs=1e-5)
    assert_same_weights(first, reference)


@pytest.mark.slow
def test_expert_parallel_resumes_from_a_one_process_checkpoint(deepseek, tmp_path: Path) -> None:
    reference, two = deepseek
    out = tmp_path / "ep-resumed"
    (out / "checkpoints").mkdir(parents=True)
    shutil.copytree(reference / "checkpoints" / "step-0000002", out / "checkpoints" / "step-0000002")
    (out / "checkpoints" / "latest").write_text("step-0000002")
    torchrun(two, out, "--set", "train.parallel.ep=2", "--set", "train.distributed=fsdp", "--resume")
    assert curve(out) == [c for c in curve(reference) if c[1] > 2]
    assert values(out) == pytest.approx([v for c, v in zip(curve(reference), values(reference)) if c[1] > 2], abs=1e-5)
    assert_same_weights(out, reference)


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path))


@pytest.mark.slow
def test_expert_parallel_beside_tensor_parallel_matches_one(deepseek, tmp_path: Path) -> None:
    # 4 processes, ranks [dp][tp]: tp 2 splits attention, the shared expert and the vocabulary; at each
    # tensor-parallel place the two data-parallel processes split the routed experts (FSDP2 across the groups).
    reference, spec = deepseek
    out = tmp_path / "ep-tp"
    done = torchrun(spec, out, "--set", "train.parallel.ep=2", "--set", "train.parallel.tp=2",
                    "--set", "train.distributed=fsdp", nproc=4)
    assert "split 2 CausalSelfAttention, 2 GatedMLP" in done.stdout
    assert "expert parallel 2 ways: split 2 MoE, 2 of 4 experts on each process" in done.stdout
    assert_same_run(out, reference)
