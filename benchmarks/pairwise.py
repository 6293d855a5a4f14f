"""Timing harness shared by the benchmarks that pit a specformer model against a
hand-written peer with the same weights: forward and training-step tokens/s, interleaved
(ours, peer, ours, peer, ...) so drift in machine load hits both alike."""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

Rows = list[tuple[str, float, float]]


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn: Callable[[], None], device: str) -> float:
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def forward_step(model: nn.Module, x: Tensor) -> None:
    with torch.no_grad():
        model(x)


def train_step(model: nn.Module, opt: torch.optim.Optimizer, x: Tensor, y: Tensor) -> None:
    """Forward, backward and AdamW; an auxiliary loss (MoE load balancing) is added when present, and a
    model's ``after_optimizer_step()`` runs after the step when it has one (as a trainer would call it)."""
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    aux = model.auxiliary_loss() if hasattr(model, "auxiliary_loss") else None
    if aux is not None:
        loss = loss + aux
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    after_step = getattr(model, "after_optimizer_step", None)  # e.g. MoE routers balanced by bias
    if after_step is not None:
        after_step()


def compare(ours: nn.Module, peer: nn.Module, *, vocab: int, batch: int, seq: int, repeats: int, device: str) -> Rows:
    """Tokens/s of both models for a forward pass and a training step, after checking equal logits."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab, (batch, seq), generator=g).to(device)
    y = torch.randint(0, vocab, (batch, seq), generator=g).to(device)
    with torch.no_grad():
        difference = (ours(x) - peer(x)).abs().max().item()
    if difference > 1e-3:
        raise SystemExit(f"the hand-written model disagrees with specformer's (max |diff| {difference:.2e})")
    tokens = batch * seq
    rows: Rows = []

    def interleaved(step_ours: Callable[[], None], step_peer: Callable[[], None]) -> tuple[float, float]:
        step_ours(), step_peer()  # warm-up (and, for training, optimizer state)
        times: dict[str, list[float]] = {"ours": [], "peer": []}
        for _ in range(repeats):
            times["ours"].append(timed(step_ours, device))
            times["peer"].append(timed(step_peer, device))
        return tokens / statistics.median(times["ours"]), tokens / statistics.median(times["peer"])

    rows.append(("forward", *interleaved(lambda: forward_step(ours, x), lambda: forward_step(peer, x))))
    opt_ours = torch.optim.AdamW(ours.parameters(), lr=1e-4)
    opt_peer = torch.optim.AdamW(peer.parameters(), lr=1e-4)
    rows.append(("train step", *interleaved(lambda: train_step(ours, opt_ours, x, y),
                                            lambda: train_step(peer, opt_peer, x, y))))
    return rows


def run_cli(doc: str, *, shapes: dict[str, dict], make_pair: Callable[[str, str], tuple[nn.Module, nn.Module]],
            default_seq: int) -> None:
    """Parse the common flags, run every chosen shape and print one table with the ratios."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=[*shapes, "all"], default="all")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=default_seq)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, device {args.device}, threads {torch.get_num_threads()}, fp32, "
          f"batch {args.batch} x seq {args.seq}, median of {args.repeats}")
    print(f"{'model':<8} {'pass':<11} {'specformer tok/s':>17} {'hand-written tok/s':>19} {'ratio':>7}")
    for name in shapes if args.model == "all" else [args.model]:
        ours, peer = make_pair(name, args.device)
        rows = compare(ours, peer, vocab=shapes[name]["vocab"], batch=args.batch, seq=args.seq,
                       repeats=args.repeats, device=args.device)
        for what, ours_tps, peer_tps in rows:
            print(f"{name:<8} {what:<11} {ours_tps:>17,.0f} {peer_tps:>19,.0f} {ours_tps / peer_tps:>7.3f}")
