"""The optional CUDA kernels: what the mixers hand them and take back, checked with stand-ins on the CPU.

The real kernels (flash-linear-attention, mamba-ssm) need CUDA, which the test machines do
not have. Each stand-in here follows its kernel's published calling convention (layout
``(B, T, H, ...)``, keyword names, ``(out, final_state)`` results) and computes with the
PyTorch recurrence, so a mixer must give the same outputs through it as without it: what
would break is the plumbing (a transpose, an argument, a dtype). ``benchmarks/gpu_check.py``
compares the real kernels with the PyTorch forms on a GPU.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
import torch

import specformer
from fixtures.tiny import tiny_spec
from specformer_layers.mixers import kernels
from specformer_layers.mixers.delta_rule import delta_rule_recurrent
from specformer_layers.mixers.ssd import ssd_recurrent


def _install(monkeypatch: pytest.MonkeyPatch, kernel: kernels.OptionalKernel, function: Any) -> list[dict[str, Any]]:
    """Put ``function`` where ``kernel`` imports it from, let it run on the CPU, and record its calls."""
    calls: list[dict[str, Any]] = []

    def recorded(*args: Any, **kwargs: Any) -> Any:
        calls.append({"args": args, "kwargs": kwargs})
        return function(*args, **kwargs)

    parts = kernel.module.split(".")
    for i in range(1, len(parts) + 1):
        monkeypatch.setitem(sys.modules, ".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    setattr(sys.modules[kernel.module], kernel.function, recorded)
    monkeypatch.setattr(kernel, "devices", ("cpu",))
    kernel.reset()
    monkeypatch.setattr(kernel, "_tried", False)
    return calls


def fla_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, **_: Any):
    """flash-linear-attention's convention: (B, T, H, ...) in, (out (B, T, H, dv), final (B, H, dk, dv)) out."""
    rule = delta_rule_recurrent(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), beta.transpose(1, 2),
                                g.transpose(1, 2), state=initial_state, scale=scale)
    return rule.out.transpose(1, 2), (rule.state if output_final_state else None)


def mamba_scan(x, dt, A, B, C, chunk_size, D=None, initial_states=None, dt_softplus=False, return_final_states=False,
               **_: Any):
    """mamba-ssm's convention: x (B, T, H, P), dt (B, T, H), B and C (B, T, G, N); (y, final (B, H, P, N))."""
    assert not dt_softplus and chunk_size > 0
    y, final, _ = ssd_recurrent(x, dt, A, B, C, D=D, state=initial_states)
    return (y.to(x.dtype), final) if return_final_states else y.to(x.dtype)


def _model(attention: dict[str, Any]) -> Any:
    spec = tiny_spec(block={"mixer": attention}, positional="none")
    return specformer.build(spec, seed=0).eval()


@torch.no_grad()
def test_gated_deltanet_gives_the_same_through_the_delta_rule_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model({"kind": "gated_deltanet", "n_heads": 4, "n_key_heads": 2, "key_head_dim": 6, "value_head_dim": 8,
                    "chunk": 4})
    ids = torch.randint(0, model.vocab_size, (2, 11), generator=torch.Generator().manual_seed(0))
    want = model(ids)
    calls = _install(monkeypatch, kernels.GATED_DELTA_RULE, fla_delta_rule)
    torch.testing.assert_close(model(ids), want, rtol=1e-5, atol=1e-5)
    assert len(calls) == 2  # one per layer
    q = calls[0]["args"][0]
    assert q.shape == (2, 11, 4, 6)  # (B, T, H, dk): value heads, keys repeated for them
    assert calls[0]["kwargs"]["g"].shape == (2, 11, 4) and calls[0]["kwargs"]["output_final_state"]


@torch.no_grad()
def test_a_kernel_is_not_used_off_its_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model({"kind": "gated_deltanet", "n_heads": 4})
    calls = _install(monkeypatch, kernels.GATED_DELTA_RULE, fla_delta_rule)
    monkeypatch.setattr(kernels.GATED_DELTA_RULE, "devices", ("cuda",))
    model(torch.ones(1, 5, dtype=torch.long))
    assert calls == []


@torch.no_grad()
def test_mamba2_gives_the_same_through_the_scan_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model({"kind": "mamba2", "n_heads": 4, "head_dim": 8, "state_size": 6, "n_groups": 2, "chunk": 4})
    ids = torch.randint(0, model.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    want = model(ids)
    calls = _install(monkeypatch, kernels.SSD, mamba_scan)
    torch.testing.assert_close(model(ids), want, rtol=1e-5, atol=1e-5)
    assert len(calls) == 2
    x, dt, _, B = calls[0]["args"][:4]
    assert x.shape == (2, 9, 4, 8) and dt.shape == (2, 9, 4) and B.shape == (2, 9, 2, 6)


def test_describe_says_whether_the_kernel_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    missing = kernels.OptionalKernel("some-package", "specformer_no_such_module", "f")
    assert missing.describe("torch chunked") == ("some-package f on CUDA (not installed: pip install "
                                                 "'specformer[kernels]'); torch chunked otherwise")
    _install(monkeypatch, kernels.SSD, mamba_scan)
    assert kernels.SSD.describe("torch").startswith("mamba-ssm mamba_chunk_scan_combined on cpu (installed)")


def test_a_kernel_whose_import_fails_leaves_the_torch_form(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(name: str) -> None:
        raise RuntimeError("CUDA driver version is insufficient")

    kernel = kernels.OptionalKernel("broken", "specformer_broken_kernel.ops", "f", devices=("cpu",))
    monkeypatch.setattr(kernels.importlib, "import_module", fail)
    assert kernel.load() is None and kernel.runs_on(torch.zeros(1)) is None


@torch.no_grad()
def test_kda_gives_the_same_through_the_per_channel_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model({"kind": "kda", "n_heads": 2, "head_dim": 6, "value_head_dim": 8, "chunk": 4})
    ids = torch.randint(0, model.vocab_size, (2, 10), generator=torch.Generator().manual_seed(2))
    want = model(ids)
    calls = _install(monkeypatch, kernels.KIMI_DELTA_RULE, fla_delta_rule)
    torch.testing.assert_close(model(ids), want, rtol=1e-5, atol=1e-5)
    assert len(calls) == 2 and calls[0]["kwargs"]["g"].shape == (2, 10, 2, 6)  # (B, T, H, dk): a decay per channel
