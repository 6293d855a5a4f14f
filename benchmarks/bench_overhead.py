"""Does building from a spec cost anything at run time?

Builds GPT-2-small-shaped and Llama-shaped models from specs and the hand-written plain
PyTorch modules of the same architecture (benchmarks/handwritten.py) with the same
weights, then prints tokens/s of a forward pass and of a full training step (forward,
backward, AdamW) for both, and the ratio specformer / hand-written (target >= 0.97).
Runs are interleaved (ours, peer, ours, peer, ...) so drift in machine load hits both.

    python benchmarks/bench_overhead.py                 # both models, CPU fp32
    python benchmarks/bench_overhead.py --model llama --batch 4 --seq 256 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from handwritten import GPT2, Llama, copy_weights_from, gpt2_spec, llama_spec  # noqa: E402

import specformer  # noqa: E402

SHAPES = {
    # GPT-2 small: the real published shape.
    "gpt2": dict(vocab=50257, d=768, n_layers=12, n_heads=12, context=1024),
    # Llama 3 family shape (GQA 4:1, SwiGLU, RoPE), scaled to fit a CPU training step in memory.
    "llama": dict(vocab=32000, d=1024, n_layers=8, n_heads=16, n_kv=4, hidden=2816, context=2048),
}


def make_pair(name: str, device: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    shape = SHAPES[name]
    if name == "gpt2":
        ours = specformer.build(gpt2_spec(**shape), seed=0, device=device)
        peer = GPT2(**shape).to(device)
    else:
        ours = specformer.build(llama_spec(**shape), seed=0, device=device)
        peer = Llama(**{k: v for k, v in shape.items() if k != "context"}).to(device)
    return ours, copy_weights_from(ours, peer)


def forward_step(model: torch.nn.Module, x: torch.Tensor) -> None:
    with torch.no_grad():
        model(x)


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device: str) -> float:
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def bench(name: str, *, batch: int, seq: int, repeats: int, device: str) -> list[tuple[str, float, float]]:
    ours, peer = make_pair(name, device)
    vocab = SHAPES[name]["vocab"]
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab, (batch, seq), generator=g).to(device)
    y = torch.randint(0, vocab, (batch, seq), generator=g).to(device)
    tokens = batch * seq
    rows = []

    fwd = {"ours": [], "peer": []}
    for model in (ours, peer):
        forward_step(model, x)  # warm-up
    for _ in range(repeats):
        fwd["ours"].append(timed(lambda: forward_step(ours, x), device))
        fwd["peer"].append(timed(lambda: forward_step(peer, x), device))
    rows.append(("forward", tokens / statistics.median(fwd["ours"]), tokens / statistics.median(fwd["peer"])))

    opts = {m: torch.optim.AdamW(m.parameters(), lr=1e-4) for m in (ours, peer)}
    for model in (ours, peer):
        train_step(model, opts[model], x, y)  # warm-up (allocates optimizer state)
    step = {"ours": [], "peer": []}
    for _ in range(repeats):
        step["ours"].append(timed(lambda: train_step(ours, opts[ours], x, y), device))
        step["peer"].append(timed(lambda: train_step(peer, opts[peer], x, y), device))
    rows.append(("train step", tokens / statistics.median(step["ours"]), tokens / statistics.median(step["peer"])))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=[*SHAPES, "all"], default="all")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, device {args.device}, threads {torch.get_num_threads()}, fp32, "
          f"batch {args.batch} x seq {args.seq}, median of {args.repeats}")
    print(f"{'model':<8} {'pass':<11} {'specformer tok/s':>17} {'hand-written tok/s':>19} {'ratio':>7}")
    for name in SHAPES if args.model == "all" else [args.model]:
        for what, ours, peer in bench(name, batch=args.batch, seq=args.seq, repeats=args.repeats, device=args.device):
            print(f"{name:<8} {what:<11} {ours:>17,.0f} {peer:>19,.0f} {ours / peer:>7.3f}")


if __name__ == "__main__":
    main()
