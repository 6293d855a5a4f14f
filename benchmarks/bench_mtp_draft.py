"""Self-speculative decoding: tokens/s with no draft, ``draft="ngram"`` and ``draft="mtp"`` on one model.

``draft="mtp"`` drafts with the model's own multi-token prediction depths, so it needs depths that
learned something: a random model's depths are almost never accepted. This script first trains a
small byte-level Llama with ``model.mtp`` on ``<repo>/../shared/data/tinyshakespeare.txt`` (next-token
loss plus each depth's weighted loss, as DeepSeek-V3 trains them) for ``--steps`` steps, then
generates greedily from prompts of the held-out last 10% and prints, for each drafter and K:
tokens/s (best of ``--repeats``), the speed-up over plain decoding, the acceptance rate (drafts
accepted / drafts proposed) and tokens per forward of the model. Greedy speculative decoding must
give the plain tokens; the script checks it and says so.

(``benchmarks/bench_generate.py`` times drafting on random weights, where an MTP depth drafts
noise; this script is separate because it needs a trained model.)

    python benchmarks/bench_mtp_draft.py [--steps 600] [--depths 1] [--draft-tokens 1 2 3] [--threads N]
    python benchmarks/bench_mtp_draft.py --quick      # a smoke run: a few steps, a tiny model
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import specformer
from specformer_generate import generate

REPO = Path(__file__).resolve().parents[1]


def spec(*, d: int, layers: int, depths: int, context: int) -> dict:
    return {"model": {
        "vocab_size": 256, "d_model": d, "n_layers": layers, "context_length": context,
        "positional": {"kind": "rope"},
        "block": {"norm": "rmsnorm", "mixer": {"kind": "attention", "n_heads": 4, "n_kv_heads": 4},
                  "ffn": {"kind": "swiglu", "hidden": 4 * d}},
        "mtp": {"depths": depths},
    }}


def train(model: Any, data: torch.Tensor, *, steps: int, batch: int, seq: int, lr: float, seed: int) -> float:
    """AdamW on random windows; loss = next-token CE + sum_k w_k * depth k's CE. Returns the last main loss."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.1)
    model.train()
    main = float("nan")
    for step in range(steps):
        for group in optimizer.param_groups:  # 5% warm-up, cosine to a tenth
            warm = min(1.0, (step + 1) / max(1, steps // 20))
            group["lr"] = lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
        starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=generator)
        ids = torch.stack([data[s : s + seq + 1] for s in starts.tolist()])  # (B, seq + 1)
        logits, mtp = model(ids[:, :-1], with_mtp=True)
        loss = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        main = float(loss.detach())
        for k, (depth_logits, weight) in enumerate(zip(mtp, model.mtp_loss_weights), start=1):
            # row i of depth k predicts token i + k + 1 of the input, i.e. ids[:, i + k + 1]
            loss = loss + weight * F.cross_entropy(depth_logits.flatten(0, 1), ids[:, k + 1 :].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if (step + 1) % 100 == 0:
            print(f"  step {step + 1}/{steps}: main loss {main:.2f}", flush=True)
    model.eval()
    return main


def counted(model: Any, prompts: list[list[int]], n: int, draft: Any, k: int) -> tuple[list[list[int]], int, int, int]:
    """Generate once, counting the model's forwards: (output, verify rounds, drafts proposed, drafts accepted)."""
    widths: list[int] = []
    handle = model.register_forward_pre_hook(lambda _m, args: widths.append(args[0].shape[1]))
    try:
        out = generate(model, prompts, max_new_tokens=n, draft=draft, draft_tokens=k)
    finally:
        handle.remove()
    rounds = widths[1:]  # the first forward is the prefill
    proposed = sum(w - 1 for w in rounds)
    accepted = (n - 1) - len(rounds)  # each round emits its kept drafts plus one token; the prefill gives one
    return out, len(rounds), proposed, accepted


def best_seconds(fn: Any, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "tinyshakespeare.txt"))
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--depths", type=int, default=1, help="MTP depths of the trained model")
    parser.add_argument("--batch", type=int, default=16, help="training batch")
    parser.add_argument("--seq", type=int, default=64, help="training sequence length")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--prompts", type=int, default=2, help="held-out prompts, generated one at a time")
    parser.add_argument("--prompt-length", type=int, default=48)
    parser.add_argument("--new-tokens", type=int, default=200)
    parser.add_argument("--draft-tokens", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="smoke run: 20 steps, d_model 32, 2 layers, 24 tokens")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.d_model, args.layers, args.new_tokens, args.repeats = 20, 32, 2, 24, 1
        args.prompts, args.draft_tokens = 1, [2]
    if args.threads:
        torch.set_num_threads(args.threads)
    text = Path(args.data).read_bytes()
    data = torch.tensor(list(text), dtype=torch.long)
    split = int(len(data) * 0.9)
    context = args.prompt_length + args.new_tokens
    model = specformer.build(spec(d=args.d_model, layers=args.layers, depths=args.depths,
                                  context=max(context, args.seq)), seed=args.seed)
    params = sum(p.numel() for p in model.parameters())
    start = time.perf_counter()
    loss = train(model, data[:split], steps=args.steps, batch=args.batch, seq=args.seq, lr=args.lr, seed=args.seed)
    print(f"model: byte Llama d={args.d_model} layers={args.layers} mtp depths={args.depths}, {params / 1e6:.2f} M "
          f"parameters; trained {args.steps} steps in {time.perf_counter() - start:.0f} s (last main loss {loss:.2f})")
    step = (len(data) - split - args.prompt_length) // max(1, args.prompts)
    prompts = [data[split + i * step : split + i * step + args.prompt_length].tolist() for i in range(args.prompts)]
    n = args.new_tokens
    print(f"{len(prompts)} held-out prompt(s) of {args.prompt_length} bytes, {n} new tokens each, greedy, batch 1, "
          f"{torch.get_num_threads()} thread(s), best of {args.repeats}")
    with torch.no_grad():
        plain = [generate(model, [p], max_new_tokens=n)[0] for p in prompts]
        base = best_seconds(lambda: [generate(model, [p], max_new_tokens=n) for p in prompts], args.repeats)
        produced = n * len(prompts)
        print(f"{'drafter':<8} {'K':>2} {'tokens/s':>9} {'speed-up':>8} {'accepted':>9} {'tokens/forward':>14}")
        print(f"{'none':<8} {'-':>2} {produced / base:>9.1f} {1.0:>8.2f} {'-':>9} {1.0:>14.2f}")
        same = True
        for draft in ("ngram", "mtp"):
            for k in args.draft_tokens:
                rounds = proposed = accepted = 0
                for prompt, expected in zip(prompts, plain):
                    out, r, p, a = counted(model, [prompt], n, draft, k)
                    same &= out[0] == expected
                    rounds, proposed, accepted = rounds + r, proposed + p, accepted + a
                seconds = best_seconds(lambda: [generate(model, [p], max_new_tokens=n, draft=draft, draft_tokens=k)
                                                for p in prompts], args.repeats)
                rate = f"{accepted / proposed:.0%}" if proposed else "-"
                per_forward = produced / (rounds + len(prompts))  # the prefill's forward gives a token too
                print(f"{draft:<8} {k:>2} {produced / seconds:>9.1f} {base / seconds:>8.2f} {rate:>9} "
                      f"{per_forward:>14.2f}")
    print(f"greedy tokens with every drafter equal plain decoding: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
