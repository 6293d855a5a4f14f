"""Does building for a checkpoint still initialise weights it then overwrites?

Importing a checkpoint (``specformer.load``, ``specformer hf import``) builds the model
of its spec and copies the stored tensors in. Before ``build(init=False)`` the model was
allocated and initialised (PyTorch's default init, then ``init_weights``) only to be
overwritten; now it is laid out on the meta device and materialised once, uninitialised.

This times both ways on a Llama-3.2-1B-shaped model (specs/llama-3.2-1b.yaml, random
bfloat16 tensors standing in for a checkpoint's), interleaved, and prints seconds and the
ratio. It needs about 8 GB of memory at the full size; ``--layers`` shrinks the model.

    python benchmarks/bench_build_for_checkpoint.py
    python benchmarks/bench_build_for_checkpoint.py --layers 4 --repeats 3
"""

from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path

import torch

import specformer
from specformer.checkpoint.save_load import load_weights
from specformer.spec import read_spec_file

SPEC = Path(__file__).resolve().parents[1] / "specs" / "llama-3.2-1b.yaml"


def stored_tensors(spec: dict) -> dict[str, torch.Tensor]:
    """Random bfloat16 tensors with the names and shapes of the model's state dict (a checkpoint's stand-in)."""
    meta = specformer.build(spec, device="meta")
    generator = torch.Generator().manual_seed(0)
    return {name: torch.randn(t.shape, generator=generator).to(torch.bfloat16) * 0.02
            for name, t in meta.state_dict().items()}


def timed_import(spec: dict, tensors: dict[str, torch.Tensor], *, init: bool) -> float:
    gc.collect()
    start = time.perf_counter()
    model = specformer.build(spec, init=init)
    load_weights(model, tensors, where="benchmark")
    seconds = time.perf_counter() - start
    del model
    gc.collect()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=None, help="Fewer layers than the spec's 16, for a quick run.")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's).")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    spec = read_spec_file(SPEC)
    if args.layers:
        spec["model"]["n_layers"] = args.layers
    tensors = stored_tensors(spec)
    params = sum(t.numel() for t in tensors.values())
    before, after = [], []
    for _ in range(args.repeats):  # interleaved, so drift in machine load hits both
        before.append(timed_import(spec, tensors, init=True))
        after.append(timed_import(spec, tensors, init=False))
    print(f"model: {SPEC.name}, {spec['model']['n_layers']} layers, {params / 1e9:.2f}B parameters, "
          f"torch threads {torch.get_num_threads()}")
    print(f"build + initialise + load (before):  best {min(before):.2f} s  (runs: {', '.join(f'{s:.2f}' for s in before)})")
    print(f"build(init=False) + load   (after):  best {min(after):.2f} s  (runs: {', '.join(f'{s:.2f}' for s in after)})")
    print(f"speed-up: {min(before) / min(after):.2f}x")


if __name__ == "__main__":
    main()
