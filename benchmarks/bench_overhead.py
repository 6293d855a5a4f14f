"""Does building from a spec cost anything at run time?

Builds GPT-2-small-shaped and Llama-shaped models from specs and the hand-written plain
PyTorch modules of the same architecture (tests/fixtures/handwritten.py) with the same
weights, then prints tokens/s of a forward pass and of a full training step (forward,
backward, AdamW) for both, and the ratio specformer / hand-written (target >= 0.97).
Runs are interleaved (ours, peer, ours, peer, ...) so drift in machine load hits both;
the harness is benchmarks/pairwise.py.

    python benchmarks/bench_overhead.py                 # both models, CPU fp32
    python benchmarks/bench_overhead.py --model llama --batch 4 --seq 256 --repeats 5
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the hand-written models are a test oracle
from fixtures.handwritten import GPT2, Llama, copy_weights_from, gpt2_spec, llama_spec  # noqa: E402
from pairwise import run_cli  # noqa: E402

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


def main() -> None:
    run_cli(__doc__, shapes=SHAPES, make_pair=make_pair, default_seq=256)


if __name__ == "__main__":
    main()
