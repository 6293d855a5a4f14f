"""GPU readiness in under five minutes: training MFU and decoding bandwidth on one CUDA card.

On a CUDA machine this

1. trains GPT-2-124M-shaped models (``specs/gpt2-124m.yaml``: plain causal, and the same
   with a sliding window in every layer) in bf16 autocast on random tokens for a few
   hundred steps and prints tokens/s and MFU (model FLOPs per token from
   ``specformer.summarize``: ``6N + 12·L·H·hd·span``, span = window or sequence);
2. decodes greedily with a Llama-shaped model (``specs/llama-3.2-1b.yaml``, bf16, KV
   cache) and prints tokens/s and the memory bandwidth that implies (every weight and
   the cached keys/values read once per token) against the card's peak;
3. ``hybrid``: trains the same GPT-2 shape with three Gated DeltaNet layers to one attention
   layer (tokens/s, MFU), and checks that the recurrent mixers' CUDA kernels
   (flash-linear-attention, mamba-ssm; ``specformer[kernels]``) give what the PyTorch forms
   give (the largest relative difference of a layer's output, fp32), or says they are not
   installed;
4. ``parallel``: one training step (SGD, fp32) of a small Llama-shaped model three ways on this one card,
   as a single-process group on NCCL: plain, FSDP2 (``fully_shard``, one shard) and tensor
   parallel over a mesh of one (the components' plans applied, the loss on logits split by
   vocabulary), and prints how far the last two's loss and updated weights are from the
   plain step's: the DTensor paths the CPU tests run on gloo, here on CUDA.

The figures of a card come from :data:`CARDS` (NVIDIA datasheets, dense bf16). Without
CUDA it prints why and exits 0, so it can sit in any script. Nothing is asserted.

    python benchmarks/gpu_check.py                       # everything, defaults below
    python benchmarks/gpu_check.py --steps 300 --batch 16 --seq 1024 --decode-tokens 256
    python benchmarks/gpu_check.py --only decode --compile
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parent.parent
TRAIN_SPEC = ROOT / "specs" / "gpt2-124m.yaml"
DECODE_SPEC = ROOT / "specs" / "llama-3.2-1b.yaml"
CASES = ("train-causal", "train-window", "decode", "hybrid", "parallel")


@dataclass(frozen=True)
class Card:
    bf16_tflops: float  # dense bf16 tensor-core peak
    bandwidth_gbs: float  # HBM bandwidth, GB/s (10^9 bytes)


#: Peak figures by a fragment of ``torch.cuda.get_device_name()``; the first match wins (order matters).
CARDS: list[tuple[str, Card]] = [
    ("H200", Card(989.0, 4800.0)),
    ("H100 PCIe", Card(756.0, 2000.0)),
    ("H100 NVL", Card(835.0, 3900.0)),
    ("H100", Card(989.0, 3350.0)),  # SXM5
    ("A100-SXM4-80GB", Card(312.0, 2039.0)),
    ("A100 80GB PCIe", Card(312.0, 1935.0)),
    ("A100", Card(312.0, 1555.0)),  # 40 GB
]


def card_for(name: str) -> Card | None:
    """The peak figures of a device named ``name``, or None when it is not in :data:`CARDS`."""
    for fragment, card in CARDS:
        if fragment in name:
            return card
    return None


# -- argument handling -----------------------------------------------------------------------------


def positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}")
        return value

    return parse


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=CASES, default=list(CASES), help="run only these cases")
    parser.add_argument("--steps", type=positive(int), default=200, help="training steps per case (default 200)")
    parser.add_argument("--batch", type=positive(int), default=16, help="training batch (default 16)")
    parser.add_argument("--seq", type=positive(int), default=1024, help="training sequence length (default 1024)")
    parser.add_argument("--window", type=positive(int), default=256, help="window of train-window (default 256)")
    parser.add_argument("--decode-tokens", type=positive(int), default=256, help="tokens decoded (default 256)")
    parser.add_argument("--prompt", type=positive(int), default=128, help="prompt length for decoding (default 128)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the training step and decoding")
    parser.add_argument("--device", default="cuda", help="a CUDA device (default cuda)")
    args = parser.parse_args(argv)
    if not args.device.startswith("cuda"):
        parser.error(f"--device must be a CUDA device (cuda or cuda:N), got {args.device!r}")
    if args.window >= args.seq:
        parser.error(f"--window ({args.window}) must be shorter than --seq ({args.seq}) to exercise the window")
    return args


# -- FLOPs and bytes -------------------------------------------------------------------------------


def train_spec(*, seq: int, window: int | None) -> dict[str, Any]:
    """GPT-2 124M's spec with context ``seq`` (and a window in every layer when given)."""
    from specformer.spec import read_spec_file

    spec = copy.deepcopy(read_spec_file(TRAIN_SPEC))
    spec["model"]["context_length"] = seq
    if window is not None:
        spec["model"]["block"]["mixer"]["window"] = window
    spec.pop("train", None)
    return spec


def train_flops_per_token(spec: dict[str, Any]) -> float:
    """Model FLOPs per trained token: 3 x (2 N_matmul + 4 L H hd span), from specformer.summarize."""
    from specformer.model.summary import summarize

    return float(summarize(spec).train_flops_per_token)


def mfu(tokens_per_s: float, flops_per_token: float, peak_tflops: float) -> float:
    return tokens_per_s * flops_per_token / (peak_tflops * 1e12)


def decode_bytes_per_token(*, param_bytes: int, kv_bytes_per_position: int, prompt: int, new_tokens: int) -> float:
    """Bytes read per decoded token: every weight once, plus the cache up to the current position (mean)."""
    mean_context = prompt + (new_tokens + 1) / 2
    return param_bytes + kv_bytes_per_position * mean_context


# -- the report ------------------------------------------------------------------------------------


@dataclass
class Row:
    case: str
    tokens_per_s: float
    utilisation: float | None  # MFU or bandwidth / peak, 0..1; None when the card is unknown
    detail: str


def format_report(device_name: str, rows: list[Row]) -> str:
    lines = [f"gpu_check on {device_name}", f"{'case':<14}{'tokens/s':>12}{'of peak':>10}  detail"]
    for row in rows:
        share = "-" if row.utilisation is None else f"{100 * row.utilisation:.1f}%"
        speed = "-" if row.tokens_per_s != row.tokens_per_s else f"{row.tokens_per_s:,.0f}"  # NaN: a check, not a speed
        lines.append(f"{row.case:<14}{speed:>12}{share:>10}  {row.detail}")
    return "\n".join(lines)


# -- the runs (CUDA only) --------------------------------------------------------------------------


def hybrid_spec(*, seq: int) -> dict[str, Any]:
    """GPT-2 124M's shape with Gated DeltaNet in three layers of four (attention in every fourth, as Qwen3.5)."""
    spec = train_spec(seq=seq, window=None)
    model = spec["model"]
    heads = model["block"]["mixer"]["n_heads"]
    model["block"]["mixer"] = {"kind": "gated_deltanet", "n_heads": heads}
    model["layers"] = [*model.get("layers", []), {"select": "3::4", "mixer": {"kind": "attention", "n_heads": heads}}]
    return spec


def run_train(args: argparse.Namespace, *, window: int | None, card: Card | None,
              spec: dict[str, Any] | None = None, name: str | None = None) -> Row:
    import torch
    import torch.nn.functional as F

    from specformer.model.builder import build

    spec = spec if spec is not None else train_spec(seq=args.seq, window=window)
    model = build(spec, device=args.device, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    step_model = torch.compile(model) if args.compile else model
    vocab = model.vocab_size
    data = torch.randint(0, vocab, (args.batch, args.seq + 1), device=args.device)  # one batch: loss must fall
    x, y = data[:, :-1], data[:, 1:]

    def step() -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(step_model(x).flatten(0, 1).float(), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()  # no sync per step

    warm = min(10, args.steps)
    first = float(step())
    for _ in range(warm - 1):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.steps - warm):
        last = step()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    tokens_per_s = (args.steps - warm) * args.batch * args.seq / max(elapsed, 1e-9)
    flops = train_flops_per_token(spec)
    name = name or ("train-window" if window else "train-causal")
    util = mfu(tokens_per_s, flops, card.bf16_tflops) if card else None
    detail = (f"loss {first:.3f} -> {float(last):.3f}, {flops / 1e9:.2f} GFLOP/token, batch {args.batch} x {args.seq}"
              + (f", window {window}" if window else ""))
    return Row(name, tokens_per_s, util, detail)


def run_decode(args: argparse.Namespace, *, card: Card | None) -> Row:
    import torch

    from specformer.model.builder import build
    from specformer.spec import read_spec_file
    from specformer.model.summary import summarize
    from specformer_generate.generation import generate

    spec = read_spec_file(DECODE_SPEC)
    model = build(spec, device=args.device, dtype=torch.bfloat16, seed=0).eval()
    prompt = torch.randint(0, model.vocab_size, (1, args.prompt), device=args.device)
    generate(model, prompt, max_new_tokens=8, compile=args.compile)  # warm-up (and compile)
    torch.cuda.synchronize()
    start = time.perf_counter()
    generate(model, prompt, max_new_tokens=args.decode_tokens, compile=args.compile)
    torch.cuda.synchronize()
    tokens_per_s = args.decode_tokens / (time.perf_counter() - start)
    summary = summarize(model)
    read = decode_bytes_per_token(param_bytes=2 * summary.total, kv_bytes_per_position=summary.kv_bytes_per_token(
        torch.bfloat16), prompt=args.prompt, new_tokens=args.decode_tokens)
    achieved = tokens_per_s * read / 1e9
    util = achieved / card.bandwidth_gbs if card else None
    return Row("decode", tokens_per_s, util, f"{achieved:,.0f} GB/s achieved ({read / 1e9:.2f} GB read per token), "
                                              f"batch 1, prompt {args.prompt}, {args.decode_tokens} new tokens")


def run_kernels(args: argparse.Namespace) -> str:
    """The largest relative difference between kernel and torch form for gated_deltanet and mamba2, or why none."""
    import torch

    from specformer.model.builder import build
    from specformer_layers.mixers import kernels

    layers = {"gated_deltanet": ({"kind": "gated_deltanet", "n_heads": 8, "chunk": 64}, kernels.GATED_DELTA_RULE),
              "mamba2": ({"kind": "mamba2", "n_heads": 8, "head_dim": 64, "state_size": 64, "n_groups": 2}, kernels.SSD)}
    words = []
    for name, (attention, kernel) in layers.items():
        if kernel.load() is None:
            words.append(f"{name}: {kernel.package} not installed")
            continue
        spec = {"model": {"vocab_size": 1024, "d_model": 512, "n_layers": 2, "context_length": 2048, "positional": "none",
                          "block": {"norm": "rmsnorm", "mixer": attention, "ffn": {"kind": "swiglu"}}}}
        model = build(spec, device=args.device, seed=0).eval()
        ids = torch.randint(0, 1024, (2, 1000), device=args.device)
        with torch.no_grad():
            fused = model(ids)
            devices, kernel.devices = kernel.devices, ()
            try:
                reference = model(ids)
            finally:
                kernel.devices = devices
        difference = float(((fused - reference).abs().max() / reference.abs().max().clamp(min=1e-12)))
        words.append(f"{name}: {kernel.package} vs torch max rel diff {difference:.1e}")
    return "; ".join(words)


#: The parallel case's model: Llama-shaped, small, an untied head (split by vocabulary under tensor parallelism).
PARALLEL_SPEC: dict[str, Any] = {"model": {
    "vocab_size": 4096, "d_model": 256, "n_layers": 2, "context_length": 256, "positional": "rope", "tie_embeddings": False,
    "block": {"norm": "rmsnorm", "mixer": {"kind": "attention", "n_heads": 8, "n_kv_heads": 4},
              "ffn": {"kind": "swiglu"}}}}


def parallel_step_differences(device: str, *, backend: str,
                              spec: dict[str, Any] | None = None) -> dict[str, tuple[float, float]]:
    """One SGD step (fp32; Adam's first step would magnify rounding in tiny gradients into whole steps) plain, under
    FSDP2 and under tensor parallelism on a one-process group:
    ``{way: (|loss - plain loss|, largest |weight - plain weight|)}``. Starts and ends the process group."""
    import os
    import socket

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from specformer.model.builder import build
    from specformer_train.parallel.layout import ParallelLayout
    from specformer_train.parallel.parallelize import parallelize
    from specformer_train.parallel.tensor import apply_tensor_parallel, vocabulary_parallel_loss
    from specformer_train.trainer import lm_loss

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:  # a free port: a fixed one may be taken by another run on the machine
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(probe.getsockname()[1])
    dist.init_process_group(backend, rank=0, world_size=1)
    try:
        spec = PARALLEL_SPEC if spec is None else spec
        ids = torch.randint(0, spec["model"]["vocab_size"], (4, 129), device=device,
                            generator=torch.Generator(device).manual_seed(0))

        def step(way: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            model = build(spec, device=device, seed=0)
            scope = contextlib.nullcontext()
            if way == "fsdp":  # as training wraps it: the layout's mesh, then parallelize's fixed order
                layout = ParallelLayout(mode="fsdp", world_size=1).with_meshes(torch.device(device).type)
                model = parallelize(model, layout, device=torch.device(device)).wrapped
            elif way == "tp":
                # parallelize splits only at tp > 1, which one process cannot be: the DTensor styles applied directly
                apply_tensor_parallel(model, mesh=init_device_mesh(torch.device(device).type, (1,)))
                scope = vocabulary_parallel_loss(model)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            with scope:
                loss = lm_loss(model(ids[:, :-1]), ids[:, 1:], masked=False)
                loss.backward()
            opt.step()
            weights = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in model.state_dict().items()}
            return loss.detach(), weights

        plain_loss, plain = step("plain")
        out = {}
        for way in ("fsdp", "tp"):
            loss, weights = step(way)
            drift = max(float((weights[k] - plain[k]).abs().max()) for k in plain)
            out[way] = (float((loss - plain_loss).abs()), drift)
        return out
    finally:
        dist.destroy_process_group()


def run_parallel(args: argparse.Namespace) -> Row:
    differences = parallel_step_differences(args.device, backend="nccl")
    detail = "; ".join(f"{way} vs plain: loss {dl:.1e}, weights {dw:.1e}" for way, (dl, dw) in differences.items())
    return Row("parallel", float("nan"), None, detail + " (one step, fp32, one process)")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (torch.cuda.is_available() is False); nothing to measure. "
              "Run it on a machine with an NVIDIA GPU.")
        return 0
    name = torch.cuda.get_device_name(torch.device(args.device))
    card = card_for(name)
    if card is None:
        print(f"gpu_check: {name} is not in the peak table (CARDS); tokens/s only, no share of peak")
    rows = []
    if "train-causal" in args.only:
        rows.append(run_train(args, window=None, card=card))
    if "train-window" in args.only:
        rows.append(run_train(args, window=args.window, card=card))
    if "decode" in args.only:
        rows.append(run_decode(args, card=card))
    if "hybrid" in args.only:
        row = run_train(args, window=None, card=card, spec=hybrid_spec(seq=args.seq), name="hybrid-train")
        row.detail += f"; kernels: {run_kernels(args)}"
        rows.append(row)
    if "parallel" in args.only:
        rows.append(run_parallel(args))
    print(format_report(name, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
