"""Throughput figures: MFU against the formula, peak FLOPs lookup, what the bar reports."""

from __future__ import annotations

import pytest
import torch

import specformer
from specformer_train import progress
from specformer_train.progress import ProgressBar, mfu, peak_flops

from .conftest import tiny_train_spec


def test_mfu_is_achieved_over_peak_flops() -> None:
    # 10k tokens/s x 6e9 FLOPs/token = 6e13 FLOP/s on 2 devices of 100 TFLOP/s: 30%.
    assert mfu(10_000, flops_per_token=6e9, peak=100e12, world_size=2) == pytest.approx(0.3)
    assert mfu(10_000, flops_per_token=6e9, peak=None) is None


def test_flops_per_token_is_six_n_plus_attention() -> None:
    model = specformer.build(tiny_train_spec(), seed=0)
    s = specformer.summarize(model)
    # Matrices: every linear weight, and the embedding once, as the tied LM head (the lookup costs nothing).
    n_matmul = sum(p.numel() for p in model.parameters() if p.dim() >= 2)
    attention = 12 * 2 * 2 * 16 * 32  # 12 * layers * heads * head_dim * context
    assert s.train_flops_per_token == 6 * n_matmul + attention


def test_peak_flops_by_gpu_name_and_none_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    assert peak_flops(torch.device("cpu"), precision="fp32") is None
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert peak_flops(torch.device("cuda", 0), precision="bf16") == 989e12
    assert peak_flops(torch.device("cuda", 0), precision="fp32") == pytest.approx(494.7e12)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 PCIe")
    assert peak_flops(torch.device("cuda", 0), precision="bf16") == 756e12
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some Future GPU")
    assert peak_flops(torch.device("cuda", 0), precision="bf16") is None
    assert all(set(figures) == {"bf16", "tf32"} for _, figures in progress.PEAK_TFLOPS)


def test_bar_reports_mfu_with_a_peak_and_gflops_without() -> None:
    cpu = ProgressBar(total=10, initial=0, enabled=False, flops_per_token=1e6, peak=None, world_size=1)
    assert cpu.update(1, loss=2.0, lr=1e-3, tokens_per_s=5000) == {"gflops_per_s": pytest.approx(5.0)}
    gpu = ProgressBar(total=10, initial=0, enabled=False, flops_per_token=1e6, peak=1e12, world_size=1)
    assert gpu.update(1, loss=2.0, lr=1e-3, tokens_per_s=5000) == {"mfu": pytest.approx(0.005)}
