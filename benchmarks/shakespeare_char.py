"""Quality against a published result: nanoGPT's CPU recipe for character-level Tiny Shakespeare.

nanoGPT's README trains a 4-layer, 4-head, 128-wide GPT on Tiny Shakespeare characters
(context 64, batch 12, 2000 iterations, lr 1e-3 with 100 warm-up steps and cosine
decay to 1e-4, AdamW beta2 0.99, weight decay 0.1, clip 1.0, no biases, no dropout)
and reports a validation loss of 1.88. specs/shakespeare-char.yaml writes that recipe
down; this script trains it on ``<repo>/../shared/data/tinyshakespeare.txt`` (first 90%
train, last 10% validation, byte tokens) and prints our validation loss (over the whole
split) next to 1.88.

    python benchmarks/shakespeare_char.py [--data PATH] [--steps N] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NANOGPT_VAL_LOSS = 1.88  # nanoGPT README, CPU ("macbook") shakespeare_char run, iter 2000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "tinyshakespeare.txt"))
    parser.add_argument("--steps", type=int, default=None, help="override the recipe's 2000 steps (quick look)")
    parser.add_argument("--out", default="runs/shakespeare-char-bench")
    args = parser.parse_args()
    if not Path(args.data).is_file():
        print(f"no corpus at {args.data}; pass --data PATH to tinyshakespeare.txt", file=sys.stderr)
        return 2

    from specformer_train import train

    start = time.perf_counter()
    result = train(REPO / "specs" / "shakespeare-char.yaml", data=args.data, out_dir=args.out, steps=args.steps)
    seconds = time.perf_counter() - start
    print()
    print("character-level Tiny Shakespeare, nanoGPT CPU recipe")
    print(f"  {'':<28}{'val loss':>10}")
    print(f"  {'nanoGPT (published)':<28}{NANOGPT_VAL_LOSS:>10.2f}")
    print(f"  {'specformer (this run)':<28}{result.val_loss:>10.4f}")
    print(f"  difference {result.val_loss - NANOGPT_VAL_LOSS:+.4f} nats/char; train loss {result.loss:.4f}; "
          f"{result.step} steps in {seconds:.0f} s (everything included)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
