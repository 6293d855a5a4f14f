"""Where one MoE layer's time goes: specformer's against the hand-written DeepSeek-V3 MoE, op by op.

Takes the first MoE layer of each model bench_router.py builds (same weights), runs it on one
batch (default 2 x 512 tokens of width 512) three times under torch.profiler, a few rounds
interleaved, and prints per side the median total of the matrix multiplications, the median
total of everything else, and the median self time of the largest ops. Per-op totals are far
steadier than wall-clock under machine load, more so with one thread (the default), so this
is the tool for comparing the expert dispatch's copies; bench_router.py gives the
end-to-end ratio. Nothing is asserted.

    OMP_NUM_THREADS=1 python benchmarks/profile_moe.py                # forward, no grad
    OMP_NUM_THREADS=1 python benchmarks/profile_moe.py --pass train   # forward + backward
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_router  # noqa: E402

MATMULS = ("aten::mm", "aten::addmm", "aten::bmm")


def run(layer: nn.Module, x: torch.Tensor, what: str) -> None:
    for _ in range(3):
        if what == "forward":
            with torch.no_grad():
                layer(x)
        else:
            layer(x).sum().backward()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pass", dest="what", choices=["forward", "train"], default="forward")
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ours, peer = bench_router.make_pair("router", "cpu")
    layers = {"specformer": ours.blocks[0].ffn, "hand-written": peer.layers[0].moe}
    d = bench_router.SHAPES["router"]["d"]
    x = torch.randn(2, args.tokens // 2, d, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        gap = (layers["specformer"](x) - layers["hand-written"](x)).abs().max().item()
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.tokens} tokens, {args.what} x3 per round, "
          f"median of {args.rounds} rounds; outputs differ by at most {gap:.1e}")
    matmul: dict[str, list[float]] = defaultdict(list)
    rest: dict[str, list[float]] = defaultdict(list)
    ops: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for _ in range(args.rounds):
        for name, layer in layers.items():
            run(layer, x, args.what)  # warm
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                run(layer, x, args.what)
            events = prof.key_averages()
            matmul[name].append(sum(e.self_cpu_time_total for e in events if e.key in MATMULS) / 1e3)
            rest[name].append(sum(e.self_cpu_time_total for e in events if e.key not in MATMULS) / 1e3)
            for e in events:
                ops[name][e.key].append(e.self_cpu_time_total / 1e3)
    for name in layers:
        top = sorted(ops[name].items(), key=lambda kv: -statistics.median(kv[1]))[:args.top]
        print(f"{name}: matmuls {statistics.median(matmul[name]):.0f} ms, everything else "
              f"{statistics.median(rest[name]):.0f} ms (min {min(rest[name]):.0f})")
        print("    " + ", ".join(f"{k.removeprefix('aten::')} {statistics.median(v):.1f}" for k, v in top))


if __name__ == "__main__":
    main()
