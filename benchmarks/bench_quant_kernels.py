"""CPU matmul kernels for quantized weights, on the matrix shapes of bench_generate's Llama.

Decoding multiplies a few activation rows (batch 1 or 8; a speculative verify reads
K+1 tokens a row) by every weight matrix once per token. This script times, for each
matrix of the 40M Llama in ``benchmarks/bench_generate.py`` (d=512, 8 heads / 4 KV,
SwiGLU 1408, vocabulary 32000), ``x @ W.T`` with:

- ``fp32``: ``F.linear`` in float32 (the reference every ratio is against);
- ``int8 weight-only``: ``torch._weight_int8pack_mm`` (bfloat16 activations);
- ``int8 fbgemm per-call``: ``quantized::linear_dynamic`` as it is (one activation
  scale for the whole call: a row's result depends on the other rows);
- ``int8 fbgemm per-row``: the same kernel with each row scaled to max |x| = 1 and a
  guard row fixing the call's range to [-1, 1] (what ``specformer_quant`` runs: a row's
  result depends on that row alone);
- ``int4``: ``torch._weight_int4pack_mm_for_cpu`` (group 32, bfloat16 activations);
- ``bf16``: ``F.linear`` in bfloat16.

Rounds are interleaved (every kernel once per round, a round after another) so load on a
shared machine hits all alike; the table gives the median time per call and the ratio
to float32 of the same round's medians, and the spread (min..max of the per-round
ratios) so a reader sees how steady the figure is.

    python benchmarks/bench_quant_kernels.py                  # 1 thread, rows 1 and 8
    python benchmarks/bench_quant_kernels.py --rows 1 5 8 --threads 2 --rounds 15
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F

from specformer_quant.int4 import Int4Weight
from specformer_quant.int8 import Int8Weight

# (name, N outputs, K inputs) of the bench's Llama: fused qkv (8x64 + 2x4x64), out, fused gate_up, down, LM head
SHAPES = [("qkv", 1024, 512), ("out", 512, 512), ("gate_up", 2816, 512), ("down", 512, 1408), ("lm_head", 32000, 512)]


def kernels(w: torch.Tensor) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    per_row = Int8Weight.from_float(w)
    per_call = Int8Weight.from_float(w)
    weight_only = Int8Weight.from_float(w)
    int4 = Int4Weight.from_float(w, group_size=32)
    wb = w.to(torch.bfloat16)
    scale_bf16 = weight_only.scale.to(torch.bfloat16)
    packed = None

    def fbgemm_per_call(x: torch.Tensor) -> torch.Tensor:
        nonlocal packed
        if packed is None:
            from specformer_quant.int8 import _prepack
            packed = _prepack(per_call.q, per_call.scale)
        return torch.ops.quantized.linear_dynamic(x, packed, True)

    return {
        "fp32": lambda x: F.linear(x, w),
        "int8 weight-only": lambda x: torch._weight_int8pack_mm(x.to(torch.bfloat16), weight_only.q, scale_bf16).float(),
        "int8 fbgemm per-call": fbgemm_per_call,
        "int8 fbgemm per-row": per_row.matmul,
        "int4": int4.matmul,
        "bf16": lambda x: F.linear(x.to(torch.bfloat16), wb).float(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8], help="activation rows per call (batch)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=20, help="calls per timing (each a new weight of the shape "
                        "would be fairer to the cache; the weights here stay cached only if they fit)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, {args.threads} thread(s), "
          f"median of {args.rounds} interleaved rounds of {args.calls} calls")
    g = torch.Generator().manual_seed(0)
    header = f"{'matrix':<8} {'N x K':>11} {'rows':>4}  {'kernel':<22} {'ms/call':>8}  {'vs fp32':>7}  {'spread':>12}"
    print(header + "\n" + "-" * len(header))
    for name, n, k in SHAPES:
        w = torch.randn(n, k, generator=g) * 0.02
        fns = kernels(w)
        for rows in args.rows:
            x = torch.randn(rows, k, generator=g)
            for fn in fns.values():  # warm-up: packing, first-call allocations
                fn(x)
            times: dict[str, list[float]] = {kernel: [] for kernel in fns}
            for _ in range(args.rounds):
                for kernel, fn in fns.items():
                    start = time.perf_counter()
                    for _ in range(args.calls):
                        fn(x)
                    times[kernel].append((time.perf_counter() - start) / args.calls)
            for kernel, t in times.items():
                ratios = [f / s for f, s in zip(times["fp32"], t)]
                print(f"{name:<8} {f'{n}x{k}':>11} {rows:>4}  {kernel:<22} {statistics.median(t) * 1e3:>8.3f}  "
                      f"{statistics.median(times['fp32']) / statistics.median(t):>6.2f}x  "
                      f"{min(ratios):>5.2f}..{max(ratios):<5.2f}")


if __name__ == "__main__":
    main()
