"""Attention variants before and after the flex/auto backends: time and peak memory.

One attention layer (CausalSelfAttention, 8 heads of 64, GQA 2:1, batch 1) on CPU fp32
by default, for each sequence length and case:

* ``causal sdpa``: plain causal attention on PyTorch's fused kernel (the bar to reach);
* ``window 512``, ``alibi``, ``softcap 30``: today's path (``backend: sdpa``, a dense
  ``T x T`` mask or bias; ``eager`` for soft-capping, which SDPA cannot do) against the
  new default (``backend: auto``);
* ``documents``: a batch packed with documents of 1,000 tokens, on ``auto``.

Each is timed for a training pass (forward + backward) and an inference forward, with
the peak of the memory allocated during it (torch.profiler's allocation records, summed
in order). Runs are interleaved by repeat so load drift hits every case alike; the
median is printed. Compiling FlexAttention happens in a warm-up call outside the timing.
Nothing is asserted: this is a measurement.

    python benchmarks/bench_attention.py                       # T = 1024, 4096, 8192
    python benchmarks/bench_attention.py --lengths 1024 4096 --repeats 3 --threads 2
    python benchmarks/bench_attention.py --device cuda --dtype bfloat16

A case whose dense scores would exceed ``--max-dense-gib`` is skipped and says so.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.profiler import ProfilerActivity, profile

from specformer.model.context import ForwardContext, default_positions
from specformer.model.positional import PositionalScheme
from specformer_layers.attention.causal import CausalSelfAttention
from specformer_layers.attention.params import CausalSelfAttentionParams
from specformer_layers.positional.alibi import ALiBi

D_MODEL, N_HEADS, N_KV = 512, 8, 4
DOCUMENT = 1000


@dataclass
class Case:
    name: str
    backend: str
    options: dict[str, Any] = field(default_factory=dict)
    alibi: bool = False
    documents: bool = False
    dense: bool = False  # materialises (B, H, T, T) scores on this path (for the memory guard)


CASES = [
    Case("causal sdpa", "sdpa"),
    Case("window 512, dense (before)", "sdpa", {"window": 512}, dense=True),
    Case("window 512, auto", "auto", {"window": 512}),
    Case("alibi, dense (before)", "sdpa", alibi=True, dense=True),
    Case("alibi, auto", "auto", alibi=True),
    Case("softcap 30, eager (before)", "eager", {"logit_softcap": 30.0}, dense=True),
    Case("softcap 30, auto", "auto", {"logit_softcap": 30.0}),
    Case("documents, auto", "auto", documents=True),
]


def make(case: Case, T: int, device: str, dtype: torch.dtype) -> Callable[[bool], torch.Tensor]:
    torch.manual_seed(0)
    params = CausalSelfAttentionParams(n_heads=N_HEADS, n_kv_heads=N_KV, backend=case.backend, **case.options)
    layer = CausalSelfAttention(params, d_model=D_MODEL).to(device, dtype)
    layer.init_weights(std=0.02, residual_std=0.02)
    x = torch.randn(1, T, D_MODEL, device=device, dtype=dtype)
    positional = ALiBi(n_heads=N_HEADS).to(device) if case.alibi else PositionalScheme()
    positions = default_positions(1, T, device=device)
    documents = (torch.arange(T, device=device) // DOCUMENT)[None] if case.documents else None

    def run(train: bool) -> torch.Tensor:
        ctx = ForwardContext(positions=positions, positional=positional, positional_state=positional.prepare(positions),
                             plain_causal=documents is None, document_ids=documents)
        if train:
            inp = x.detach().requires_grad_()
            layer(inp, ctx).sum().backward()
            return inp.grad
        with torch.no_grad():
            return layer(x, ctx)

    return run


def peak_bytes(fn: Callable[[], Any]) -> int:
    """The peak of bytes allocated during ``fn`` (allocations minus frees, in order)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as recording:
        fn()
    # Self memory: an allocation counts once, in the op that made it (not again in each enclosing op).
    events = sorted((e for e in recording.events() if e.self_cpu_memory_usage), key=lambda e: e.time_range.start)
    level = peak = 0
    for event in events:
        level += event.self_cpu_memory_usage
        peak = max(peak, level)
    return peak


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure(cases: list[Case], T: int, *, repeats: int, device: str, dtype: torch.dtype,
            max_dense_gib: float) -> list[tuple[str, str, float, float, float, float]]:
    runs, rows = {}, []
    for case in cases:
        dense_gib = 3 * N_HEADS * T * T * 4 / 2**30 if case.dense else 0.0  # scores, weights, grads
        if dense_gib > max_dense_gib:
            rows.append((case.name, f"skipped (dense scores ~{dense_gib:.0f} GiB > --max-dense-gib)", 0, 0, 0, 0))
            continue
        run = make(case, T, device, dtype)
        run(False), run(True)  # warm-up: compiles FlexAttention once per shape bucket
        runs[case.name] = run
    times: dict[tuple[str, bool], list[float]] = {(name, t): [] for name in runs for t in (True, False)}
    for _ in range(repeats):
        for name, run in runs.items():
            for train in (True, False):
                sync(device)
                start = time.perf_counter()
                run(train)
                sync(device)
                times[name, train].append(time.perf_counter() - start)
    for case in cases:
        if case.name not in runs:
            continue
        run = runs[case.name]
        rows.append((case.name, "", statistics.median(times[case.name, True]), peak_bytes(lambda: run(True)),
                     statistics.median(times[case.name, False]), peak_bytes(lambda: run(False))))
    return rows


def report(T: int, rows: list[tuple[str, str, float, float, float, float]]) -> str:
    base = next((r for r in rows if r[0] == "causal sdpa" and not r[1]), None)
    lines = [f"T = {T}", "| case | train ms | train peak MiB | x causal | infer ms | infer peak MiB | x causal |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, note, train_s, train_mem, infer_s, infer_mem in rows:
        if note:
            lines.append(f"| {name} | {note} | | | | | |")
            continue
        rel_train = f"{train_s / base[2]:.2f}" if base else "-"
        rel_infer = f"{infer_s / base[4]:.2f}" if base else "-"
        lines.append(f"| {name} | {1e3 * train_s:,.1f} | {train_mem / 2**20:,.0f} | {rel_train} | "
                     f"{1e3 * infer_s:,.1f} | {infer_mem / 2**20:,.0f} | {rel_infer} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 8192])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: PyTorch's)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--max-dense-gib", type=float, default=6.0)
    parser.add_argument("--cases", nargs="+", default=None, help="substrings of case names to run")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cases = [c for c in CASES if args.cases is None or any(s in c.name for s in args.cases)]
    print(f"one attention layer, d_model {D_MODEL}, {N_HEADS} heads x {D_MODEL // N_HEADS}, {N_KV} kv heads, batch 1, "
          f"{args.device} {args.dtype}, {torch.get_num_threads()} threads, median of {args.repeats}")
    for T in args.lengths:
        rows = measure(cases, T, repeats=args.repeats, device=args.device, dtype=getattr(torch, args.dtype),
                       max_dense_gib=args.max_dense_gib)
        print(report(T, rows), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
