"""Hybrid models (recurrent mixers with a few attention layers) against their peers, CPU fp32.

Three parts, each printing our figure next to a peer's measured in the same run, and the ratio:

(a) ``decode``: decode tokens/s (batch 1, greedy, one token per forward through the generation
    cache) and the cache's memory after a context of 512, 2k and 8k tokens, for a 3:1 hybrid
    (three recurrent layers to one attention layer) against an all-attention model of the same
    width and depth. The recurrent layers keep a state of fixed size; only the attention layers'
    keys grow with the context.
(b) ``prefill``: a 4k-token prompt read into the cache by a model whose every layer is the
    recurrent mixer: in one forward (the parallel form: one convolution for ``short_conv``, the
    chunked form for the others) against one token per forward (the recurrent form decoding
    uses). Both must leave the same logits.
(c) ``train``: a training step (forward, backward, AdamW) of the 3:1 hybrid against transformers'
    model of the same family holding the same weights: ``short_conv`` against ``Lfm2ForCausalLM``
    (exported with ``specformer_hf.to_hf``, loaded with ``from_pretrained``; logits checked equal
    first), and the other mixers against their transformers families where those exist.

Every mixer registered in the ``attention`` kind among ``short_conv``, ``gated_deltanet`` and
``mamba2`` is measured; the ones this checkout lacks are listed as skipped. Runs alternate
(ours, peer, ours, ...) and the median of ``--repeats`` is kept, so load on a shared machine
hits both alike.

    python benchmarks/bench_hybrid.py                  # all parts, a few minutes on 2 cores
    python benchmarks/bench_hybrid.py --part decode    # one part
    python benchmarks/bench_hybrid.py --quick          # toy sizes, seconds (what the smoke test runs)
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor, nn

import specformer
from specformer_generate import StaticKVCache

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pairwise import train_step  # noqa: E402


@dataclass(frozen=True)
class Sizes:
    """One configuration of the whole benchmark."""

    vocab: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    hidden: int
    contexts: tuple[int, ...]  # (a): decode after this many tokens
    new_tokens: int  # (a): tokens decoded (and timed) per run
    prompt: int  # (b): the prompt read into the cache
    train_batch: int
    train_seq: int
    repeats: int


FULL = Sizes(vocab=4096, d_model=256, n_layers=8, n_heads=4, n_kv_heads=2, hidden=768, contexts=(512, 2048, 8192),
             new_tokens=32, prompt=4096, train_batch=2, train_seq=512, repeats=3)
QUICK = Sizes(vocab=128, d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, hidden=64, contexts=(16, 48),
              new_tokens=4, prompt=32, train_batch=1, train_seq=16, repeats=1)

#: The recurrent mixers measured (when registered), as the block's ``attention`` entry.
MIXERS: dict[str, dict[str, Any]] = {
    "short_conv": {"kind": "short_conv", "kernel": 3},
    "gated_deltanet": {"kind": "gated_deltanet"},
    "mamba2": {"kind": "mamba2"},
}


def attention(sizes: Sizes) -> dict[str, Any]:
    # RMSNorm on each query and key head, as LFM2's attention layers (so the short_conv hybrid exports as LFM2).
    return {"kind": "attention", "n_heads": sizes.n_heads, "n_kv_heads": sizes.n_kv_heads,
            "qk_norm": {"kind": "rmsnorm", "eps": 1e-5}, "qk_norm_scope": "head"}


def spec(sizes: Sizes, mixer: dict[str, Any] | None, *, attention_every: int | None = 4) -> dict[str, Any]:
    """A pre-norm RMSNorm / SwiGLU model: ``mixer`` in every layer but every ``attention_every``-th (attention);
    ``mixer`` None: attention everywhere; ``attention_every`` None: no attention layer."""
    context = max(*sizes.contexts, sizes.prompt, sizes.train_seq) + sizes.new_tokens
    model: dict[str, Any] = {
        "vocab_size": sizes.vocab, "d_model": sizes.d_model, "n_layers": sizes.n_layers, "context_length": context,
        "tie_embeddings": True, "positional": {"kind": "rope", "theta": 1_000_000.0},
        "block": {"layout": "prenorm", "norm": {"kind": "rmsnorm", "eps": 1e-5},
                  "attention": attention(sizes) if mixer is None else dict(mixer),
                  "ffn": {"kind": "swiglu", "hidden": sizes.hidden}},
    }
    if mixer is not None and attention_every is not None:
        first = attention_every - 1
        model["layers"] = [{"select": f"{first}::{attention_every}", "attention": attention(sizes)}]
    return {"model": model}


def available_mixers() -> tuple[list[str], list[str]]:
    names = set(specformer.get_registry().names("attention"))
    return [m for m in MIXERS if m in names], [m for m in MIXERS if m not in names]


def build(data: dict[str, Any], seed: int = 0) -> nn.Module:
    return specformer.build(data, seed=seed).eval()


def median_rate(count: int, seconds: list[float]) -> float:
    return count / statistics.median(seconds)


def alternate(runs: dict[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """Seconds of each run, ``repeats`` times in turn (ours, peer, ours, peer, ...), after one warm-up each."""
    for run in runs.values():
        run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            times[name].append(run())
    return times


def size(n: int) -> str:
    return f"{n / 2**20:,.2f} MiB" if n >= 2**20 else f"{n / 2**10:,.1f} KiB"


# -- (a) decode after a long context --------------------------------------------------------------------


def prefilled(model: nn.Module, ids: Tensor, *, capacity: int, chunk: int = 1024) -> StaticKVCache:
    """A cache holding ``ids`` ``(1, T)``, read in chunks (a whole 8k prompt's attention mask is not needed)."""
    cache = StaticKVCache.for_model(model, batch_size=1, capacity=capacity)
    with torch.inference_mode():
        for start in range(0, ids.shape[1], chunk):
            piece = ids[:, start:start + chunk]
            model(piece, positions=torch.arange(start, start + piece.shape[1])[None], cache=cache, last_only=True)
    return cache


def decode_seconds(model: nn.Module, ready: StaticKVCache, *, context: int, new_tokens: int) -> float:
    """Seconds to decode ``new_tokens`` greedily after the context ``ready`` holds (on a copy of it)."""
    cache = copy.deepcopy(ready)
    token = torch.zeros((1, 1), dtype=torch.long)
    with torch.inference_mode():
        start = time.perf_counter()
        for t in range(new_tokens):
            logits = model(token, positions=torch.full((1, 1), context + t), cache=cache)
            token = logits[:, -1:].argmax(-1)
        return time.perf_counter() - start


def part_decode(sizes: Sizes, mixers: list[str]) -> None:
    print("\n(a) decode after a context: 3:1 hybrid (ours) against all-attention, same width and depth "
          f"(d_model {sizes.d_model}, {sizes.n_layers} layers, batch 1, {sizes.new_tokens} new tokens)")
    print(f"{'mixer':<15} {'context':>7} {'hybrid tok/s':>13} {'attention tok/s':>16} {'ratio':>6} "
          f"{'hybrid cache':>14} {'attention cache':>16} {'ratio':>6}")
    dense = build(spec(sizes, None))
    for name in mixers:
        hybrid = build(spec(sizes, MIXERS[name]))
        for context in sizes.contexts:
            ids = torch.randint(0, sizes.vocab, (1, context), generator=torch.Generator().manual_seed(context))
            capacity = context + sizes.new_tokens
            caches = {"hybrid": prefilled(hybrid, ids, capacity=capacity),
                      "attention": prefilled(dense, ids, capacity=capacity)}
            models = {"hybrid": hybrid, "attention": dense}
            times = alternate({k: (lambda k=k: decode_seconds(models[k], caches[k], context=context,
                                                              new_tokens=sizes.new_tokens)) for k in models},
                              sizes.repeats)
            ours, peer = (median_rate(sizes.new_tokens, times[k]) for k in ("hybrid", "attention"))
            ours_bytes, peer_bytes = caches["hybrid"].nbytes, caches["attention"].nbytes
            print(f"{name:<15} {context:>7,} {ours:>13,.1f} {peer:>16,.1f} {ours / peer:>6.2f} "
                  f"{size(ours_bytes):>14} {size(peer_bytes):>16} {ours_bytes / peer_bytes:>6.3f}")


# -- (b) prefill: the parallel form against the recurrent one ----------------------------------------------


def part_prefill(sizes: Sizes, mixers: list[str]) -> None:
    print(f"\n(b) prefill of a {sizes.prompt:,}-token prompt into the cache, every layer the mixer: one forward "
          "(parallel / chunked form, ours) against one token per forward (recurrent form)")
    print(f"{'mixer':<15} {'one forward tok/s':>18} {'token by token tok/s':>21} {'ratio':>7} {'max |logit diff|':>17}")
    ids = torch.randint(0, sizes.vocab, (1, sizes.prompt), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(sizes.prompt)[None]
    for name in mixers:
        model = build(spec(sizes, MIXERS[name], attention_every=None))
        last: dict[str, Tensor] = {}

        def whole() -> float:
            cache = StaticKVCache.for_model(model, batch_size=1, capacity=sizes.prompt)
            with torch.inference_mode():
                start = time.perf_counter()
                last["whole"] = model(ids, positions=positions, cache=cache, last_only=True)[:, -1]
                return time.perf_counter() - start

        def stepwise() -> float:
            cache = StaticKVCache.for_model(model, batch_size=1, capacity=sizes.prompt)
            with torch.inference_mode():
                start = time.perf_counter()
                for t in range(sizes.prompt):
                    logits = model(ids[:, t:t + 1], positions=positions[:, t:t + 1], cache=cache)
                last["steps"] = logits[:, -1]
                return time.perf_counter() - start

        # The token-by-token run is long: fewer repeats of it say as much.
        times = alternate({"whole": whole, "steps": stepwise}, max(1, sizes.repeats - 1))
        ours, peer = (median_rate(sizes.prompt, times[k]) for k in ("whole", "steps"))
        difference = (last["whole"] - last["steps"]).abs().max().item()
        print(f"{name:<15} {ours:>18,.0f} {peer:>21,.0f} {ours / peer:>7.1f} {difference:>17.2e}")


# -- (c) a training step against transformers ------------------------------------------------------------


class Logits(nn.Module):
    """A transformers causal LM as ``x -> logits`` (what pairwise.train_step calls)."""

    def __init__(self, hf: nn.Module) -> None:
        super().__init__()
        self.hf = hf

    def forward(self, x: Tensor) -> Tensor:
        return self.hf(x, use_cache=False).logits


def transformers_twin(model: nn.Module, family: str) -> nn.Module:
    """The transformers model of ``family`` holding ``model``'s weights: exported, then loaded by transformers."""
    import specformer_hf
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = specformer_hf.to_hf(model, Path(folder) / "model", family=family)
        hf = AutoModelForCausalLM.from_pretrained(out).train()
    return Logits(hf)


#: mixer -> (the transformers family its hybrid exports as, transformers' class), when there is one.
TRAIN_PEERS: dict[str, str] = {"short_conv": "lfm2", "gated_deltanet": "qwen3_next", "mamba2": "mamba2"}


def part_train(sizes: Sizes, mixers: list[str]) -> None:
    print(f"\n(c) training step (forward, backward, AdamW) of the 3:1 hybrid against transformers with the same "
          f"weights, batch {sizes.train_batch} x {sizes.train_seq}")
    print(f"{'mixer':<15} {'peer':<28} {'ours tok/s':>11} {'peer tok/s':>11} {'ratio':>6} {'max |logit diff|':>17}")
    g = torch.Generator().manual_seed(2)
    x = torch.randint(0, sizes.vocab, (sizes.train_batch, sizes.train_seq), generator=g)
    y = torch.randint(0, sizes.vocab, (sizes.train_batch, sizes.train_seq), generator=g)
    tokens = x.numel()
    for name in mixers:
        ours = build(spec(sizes, MIXERS[name]))
        try:
            peer = transformers_twin(ours, TRAIN_PEERS[name])
        except Exception as exc:  # noqa: BLE001 - a family this checkout cannot export yet: say so, go on
            print(f"{name:<15} skipped: no transformers peer ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})")
            continue
        with torch.no_grad():
            difference = (ours(x) - peer(x)).abs().max().item()
        ours.train()
        opt_ours = torch.optim.AdamW(ours.parameters(), lr=1e-4)
        opt_peer = torch.optim.AdamW(peer.parameters(), lr=1e-4)

        def step(model: nn.Module, opt: torch.optim.Optimizer) -> Callable[[], float]:
            def run() -> float:
                start = time.perf_counter()
                train_step(model, opt, x, y)
                return time.perf_counter() - start
            return run

        times = alternate({"ours": step(ours, opt_ours), "peer": step(peer, opt_peer)}, sizes.repeats)
        ours_tps, peer_tps = (median_rate(tokens, times[k]) for k in ("ours", "peer"))
        label = type(peer.hf).__name__
        print(f"{name:<15} {label:<28} {ours_tps:>11,.0f} {peer_tps:>11,.0f} {ours_tps / peer_tps:>6.2f} "
              f"{difference:>17.2e}")


PARTS = {"decode": part_decode, "prefill": part_prefill, "train": part_train}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=[*PARTS, "all"], default="all")
    parser.add_argument("--quick", action="store_true", help="toy sizes: every part in seconds (the smoke test)")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs of each side (median kept)")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.repeats is not None:
        if args.repeats < 1:
            parser.error(f"--repeats must be at least 1, got {args.repeats}")
        sizes = Sizes(**{**sizes.__dict__, "repeats": args.repeats})
    torch.manual_seed(0)
    mixers, missing = available_mixers()
    print(f"torch {torch.__version__}, CPU fp32, {torch.get_num_threads()} threads; mixers: {', '.join(mixers)}"
          + (f" (not registered here, skipped: {', '.join(missing)})" if missing else ""))
    for name, part in PARTS.items():
        if args.part in (name, "all"):
            part(sizes, mixers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
