"""benchmarks/gpu_check.py's CPU side: arguments, FLOP and byte counting, the card table, the report, no CUDA."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from specformer.model.builder import build
from fixtures.tiny import tiny_spec

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"
spec = importlib.util.spec_from_file_location("gpu_check", PATH)
gpu_check = importlib.util.module_from_spec(spec)
sys.modules["gpu_check"] = gpu_check  # dataclasses look their module up
spec.loader.exec_module(gpu_check)


def test_without_cuda_it_says_so_and_exits_zero(monkeypatch, capsys) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main([]) == 0
    assert "no CUDA device here" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["--steps", "0"], "--steps: expected a positive int, got '0'"),
    (["--batch", "two"], "--batch: expected a positive int, got 'two'"),
    (["--device", "cpu"], "--device must be a CUDA device"),
    (["--window", "2048", "--seq", "1024"], "--window (2048) must be shorter than --seq (1024)"),
    (["--only", "prefill"], "invalid choice: 'prefill'"),
])
def test_bad_arguments_exit_2_with_one_clear_line(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        gpu_check.parse_args(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_defaults_run_every_case_in_bf16_sized_for_five_minutes() -> None:
    args = gpu_check.parse_args([])
    assert args.only == ["train-causal", "train-window", "decode", "hybrid", "parallel"]
    assert (args.steps, args.batch, args.seq, args.window, args.decode_tokens) == (200, 16, 1024, 256, 256)


def written_out_train_flops(model, *, seq: int, window: int | None) -> float:
    """6 x (matmul parameters: every Linear in the blocks, biases counted, and the tied LM head) + 12 L H hd span."""
    linears = [m for m in model.blocks.modules() if isinstance(m, torch.nn.Linear)]
    matmul = sum(m.weight.numel() + (m.bias.numel() if m.bias is not None else 0) for m in linears)
    matmul += model.embedding.weight.numel()  # the tied LM head is a matmul over the embedding
    span = seq if window is None else min(window, seq)
    attention = sum(12 * a.n_heads * a.head_dim * span for a in model.attention_modules())
    return 6 * matmul + attention


@pytest.mark.parametrize("window", [None, 256])
def test_train_flops_per_token_are_the_written_out_count(window) -> None:
    spec = gpu_check.train_spec(seq=1024, window=window)
    assert spec["model"]["context_length"] == 1024
    model = build(spec, device="meta")
    assert gpu_check.train_flops_per_token(spec) == written_out_train_flops(model, seq=1024, window=window)


def test_the_window_lowers_the_attention_flops_only() -> None:
    full = gpu_check.train_flops_per_token(gpu_check.train_spec(seq=1024, window=None))
    windowed = gpu_check.train_flops_per_token(gpu_check.train_spec(seq=1024, window=256))
    model = build(gpu_check.train_spec(seq=1024, window=None), device="meta")
    a = model.attention_modules()[0]
    assert full - windowed == 12 * len(model.blocks) * a.n_heads * a.head_dim * (1024 - 256)


def test_mfu_and_decode_bandwidth_formulas() -> None:
    # 100k tokens/s at 1 GFLOP/token on a 989 TFLOP/s card.
    assert gpu_check.mfu(1e5, 1e9, 989.0) == pytest.approx(1e14 / 989e12)
    # 1 GB of weights, 1 KiB of cache per position; positions 129..256 read on average 128 + 128.5.
    read = gpu_check.decode_bytes_per_token(param_bytes=10**9, kv_bytes_per_position=1024, prompt=128,
                                            new_tokens=256)
    assert read == pytest.approx(10**9 + 1024 * (128 + 128.5))


@pytest.mark.parametrize("name,tflops,bandwidth", [
    ("NVIDIA H100 80GB HBM3", 989.0, 3350.0), ("NVIDIA H100 PCIe", 756.0, 2000.0),
    ("NVIDIA H200", 989.0, 4800.0), ("NVIDIA A100-SXM4-80GB", 312.0, 2039.0), ("NVIDIA A100-SXM4-40GB", 312.0, 1555.0),
])
def test_the_card_table_matches_the_device_names_cuda_reports(name, tflops, bandwidth) -> None:
    card = gpu_check.card_for(name)
    assert (card.bf16_tflops, card.bandwidth_gbs) == (tflops, bandwidth)


def test_an_unknown_card_has_no_peak() -> None:
    assert gpu_check.card_for("NVIDIA GeForce GTX 1080") is None


def test_report_lines() -> None:
    rows = [gpu_check.Row("train-causal", 123456.7, 0.4321, "loss 10.9 -> 3.2"),
            gpu_check.Row("decode", 98.76, None, "unknown card")]
    assert gpu_check.format_report("NVIDIA H100", rows).splitlines() == [
        "gpu_check on NVIDIA H100",
        "case              tokens/s   of peak  detail",
        "train-causal       123,457     43.2%  loss 10.9 -> 3.2",
        "decode                  99         -  unknown card",
    ]


def test_the_hybrid_case_is_a_three_to_one_gated_deltanet_model_with_its_flops():
    import specformer

    spec = gpu_check.hybrid_spec(seq=256)
    summary = specformer.summarize(spec)
    kernels = [label for (label, _), _count in summary.attention_kernels.items()]
    assert sorted(kernels) == ["attention kernel", "mixer kernel"]
    assert sum(count for (label, _), count in summary.attention_kernels.items() if label == "mixer kernel") == 9
    assert summary.state_elements_per_sequence > 0
    assert gpu_check.train_flops_per_token(spec) > 0


def test_without_the_kernel_packages_the_check_says_so():
    words = gpu_check.run_kernels(gpu_check.parse_args(["--only", "hybrid"]))
    assert words == ("gated_deltanet: flash-linear-attention not installed; mamba2: mamba-ssm not installed")


@pytest.mark.slow
def test_the_parallel_case_steps_like_the_plain_one_on_gloo() -> None:
    # The CUDA case runs the same function on NCCL; here FSDP2 and tensor parallelism over one CPU process.
    differences = gpu_check.parallel_step_differences("cpu", backend="gloo")
    assert set(differences) == {"fsdp", "tp"}
    for way, (loss, weights) in differences.items():
        assert loss < 1e-5 and weights < 1e-5, (way, loss, weights)


def test_a_check_row_prints_no_speed() -> None:
    report = gpu_check.format_report("card", [gpu_check.Row("parallel", float("nan"), None, "fsdp vs plain: ...")])
    assert report.splitlines()[-1].split()[:3] == ["parallel", "-", "-"]


def test_the_parallel_check_runs_on_cpu_and_the_ways_agree_with_plain(monkeypatch) -> None:
    """The check's code path (the layout and parallelize for FSDP2, DTensor styles for tp) on gloo: it runs only
    where a GPU is lent, so this is what keeps it working between loans."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        monkeypatch.setenv("MASTER_PORT", str(probe.getsockname()[1]))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    tiny = tiny_spec(vocab_size=96, context_length=256, tie_embeddings=False, block={"ffn": {"kind": "swiglu"}})
    differences = gpu_check.parallel_step_differences("cpu", backend="gloo", spec=tiny)
    assert set(differences) == {"fsdp", "tp"}
    for way, (loss, weights) in differences.items():
        assert loss < 1e-5 and weights < 1e-5, (way, loss, weights)
