"""Sparse attention by a lightning indexer (DeepSeek-V3.2) against dense causal attention: forward time, peak memory.

One latent-attention layer (DeepSeek-V3's ratios at a CPU-friendly width) built twice with the
same weights: with an indexer (``indexer: {kind: lightning, topk: 512}``: every query reads its
512 best keys, scored by the indexer block by block, gathered, attended in the latent) and without
(the dense causal path: PyTorch's fused SDPA kernel, what ``mla`` runs on a plain prompt). Both run
a forward over T tokens (no gradients); time is the best of ``--repeats`` interleaved runs, peak
memory the highest level of bytes allocated during one run (torch.profiler's allocation records,
as ``bench_attention.py`` measures). The ratio dense / sparse > 1 means the sparse layer is faster.

    python benchmarks/bench_sparse_attention.py                       # T = 8192, memory at 2048, 4096, 8192, block 256
    python benchmarks/bench_sparse_attention.py --lengths 1024 2048 --time-at 2048
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

import specformer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_attention import peak_bytes  # noqa: E402

#: DeepSeek-V3.2's attention ratios (128 heads, q_lora 1536, kv_lora 512, rope 64, nope 128, v 128; indexer 64 heads
#: of 128 channels) scaled to a CPU-friendly width.
SHAPE = dict(d=512, n_heads=8, q_lora=192, kv_lora=64, rope=16, nope=32, v=32, index_heads=4, index_dim=32)


def spec(*, topk: int | None, context: int, block: int) -> dict[str, Any]:
    s = SHAPE
    attention: dict[str, Any] = {"kind": "mla", "n_heads": s["n_heads"], "q_lora_rank": s["q_lora"],
                                 "kv_lora_rank": s["kv_lora"], "qk_rope_head_dim": s["rope"],
                                 "qk_nope_head_dim": s["nope"], "v_head_dim": s["v"]}
    if topk is not None:
        attention["indexer"] = {"kind": "lightning", "topk": topk, "n_heads": s["index_heads"],
                                "head_dim": s["index_dim"], "block": block}
    return {"model": {"vocab_size": 256, "d_model": s["d"], "n_layers": 1, "context_length": context,
                      "tie_embeddings": False, "positional": {"kind": "rope", "interleaved": True},
                      "block": {"norm": {"kind": "rmsnorm", "eps": 1e-6}, "mixer": attention,
                                "ffn": {"kind": "swiglu", "hidden": 64}}}}


def layers(*, topk: int, context: int, block: int) -> tuple[Any, Any, Any]:
    """(sparse model, its attention, the dense attention with the same weights)."""
    sparse = specformer.build(spec(topk=topk, context=context, block=block), seed=0).eval()
    dense = specformer.build(spec(topk=None, context=context, block=block), seed=0).eval()
    dense_attention = dense.blocks[0].mixer
    shared = {k: v for k, v in sparse.blocks[0].mixer.state_dict().items() if not k.startswith("indexer.")}
    dense_attention.load_state_dict(shared)
    return sparse, sparse.blocks[0].mixer, dense_attention


def runner(model: Any, attention: Any, T: int) -> Callable[[], Any]:
    x = torch.randn(1, T, SHAPE["d"], generator=torch.Generator().manual_seed(0))
    ctx = model._context(torch.arange(T)[None], cache=None, plain_causal=True)

    def run() -> Any:
        ctx.masks.clear()
        with torch.no_grad():
            return attention(x, ctx)

    return run


def best_time(fns: list[Callable[[], Any]], repeats: int) -> list[float]:
    """The best wall time of each fn over ``repeats`` interleaved rounds (one warm-up round first)."""
    for fn in fns:
        fn()
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topk", type=int, default=512)
    parser.add_argument("--block", type=int, default=256, help="queries the indexer scores at once")
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192], help="T for peak memory")
    parser.add_argument("--time-at", type=int, default=8192, help="T for the forward time")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    context = max(args.lengths + [args.time_at])
    model, sparse, dense = layers(topk=args.topk, context=context, block=args.block)
    with torch.no_grad():  # the same layer: on T <= topk the sparse one reads every key
        short = runner(model, sparse, args.topk)(), runner(model, dense, args.topk)()
        assert torch.allclose(*short, atol=1e-5), "at T <= topk the indexed layer must equal the dense one"
    print(f"latent attention d={SHAPE['d']} heads={SHAPE['n_heads']} kv_lora={SHAPE['kv_lora']}, indexer "
          f"{SHAPE['index_heads']} heads x {SHAPE['index_dim']}, topk={args.topk}, block={args.block}, "
          f"threads={torch.get_num_threads()}")
    print(f"{'T':>6}  {'sparse peak MiB':>15}  {'dense (SDPA) peak MiB':>21}")
    for T in args.lengths:
        peaks = [peak_bytes(runner(model, layer, T)) / 2**20 for layer in (sparse, dense)]
        print(f"{T:>6}  {peaks[0]:>15.1f}  {peaks[1]:>21.1f}")
    t_sparse, t_dense = best_time([runner(model, sparse, args.time_at), runner(model, dense, args.time_at)],
                                  args.repeats)
    print(f"forward at T={args.time_at}: sparse {t_sparse * 1e3:.0f} ms, dense (SDPA causal) {t_dense * 1e3:.0f} ms, "
          f"dense / sparse = {t_dense / t_sparse:.2f}")


if __name__ == "__main__":
    main()
