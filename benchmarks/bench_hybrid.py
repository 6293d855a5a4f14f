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
    python benchmarks/bench_hybrid.py --part prefill --mixer mamba2   # one part, one mixer
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

def mixers(sizes: Sizes) -> dict[str, dict[str, Any]]:
    """The recurrent mixers measured (when registered), as the block's ``attention`` entry, at these sizes.

    Gated DeltaNet as Qwen3-Next shapes it (two query/key heads serving twice as many value heads,
    heads of d_model / n_heads); Mamba-2 with its inner width twice d_model (expand 2), one group.
    """
    head = 2 * sizes.d_model // 8
    return {
        "short_conv": {"kind": "short_conv", "kernel": 3},
        "gated_deltanet": {"kind": "gated_deltanet", "n_heads": sizes.n_heads, "n_key_heads": sizes.n_heads // 2},
        "mamba2": {"kind": "mamba2", "n_heads": 8, "head_dim": head, "state_size": min(64, sizes.d_model // 2),
                   "n_groups": 1},
    }


MIXERS = list(mixers(QUICK))


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
                  "mixer": attention(sizes) if mixer is None else dict(mixer),
                  "ffn": {"kind": "swiglu", "hidden": sizes.hidden}},
    }
    if mixer is not None and attention_every is not None:
        first = attention_every - 1
        model["layers"] = [{"select": f"{first}::{attention_every}", "mixer": attention(sizes)}]
    return {"model": model}


def available_mixers() -> tuple[list[str], list[str]]:
    names = set(specformer.get_registry().names("mixer"))
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


def part_decode(sizes: Sizes, names: list[str]) -> None:
    print("\n(a) decode after a context: 3:1 hybrid (ours) against all-attention, same width and depth "
          f"(d_model {sizes.d_model}, {sizes.n_layers} layers, batch 1, {sizes.new_tokens} new tokens)")
    print(f"{'mixer':<15} {'context':>7} {'hybrid tok/s':>13} {'attention tok/s':>16} {'ratio':>6} "
          f"{'hybrid cache':>14} {'attention cache':>16} {'ratio':>6}")
    dense = build(spec(sizes, None))
    for name in names:
        hybrid = build(spec(sizes, mixers(sizes)[name]))
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


def part_prefill(sizes: Sizes, names: list[str]) -> None:
    print(f"\n(b) prefill of a {sizes.prompt:,}-token prompt into the cache, every layer the mixer: one forward "
          "(parallel / chunked form, ours) against one token per forward (recurrent form)")
    print(f"{'mixer':<15} {'one forward tok/s':>18} {'token by token tok/s':>21} {'ratio':>7} {'max |logit diff|':>17}")
    ids = torch.randint(0, sizes.vocab, (1, sizes.prompt), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(sizes.prompt)[None]
    for name in names:
        model = build(spec(sizes, mixers(sizes)[name], attention_every=None))
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


def quiet() -> Any:
    """transformers' notes (its torch fallbacks, weight loading) and ours (no tokenizer) kept off the table."""
    import contextlib

    from transformers.utils import logging as hf_logging

    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    stack.callback(hf_logging.set_verbosity, verbosity)
    stack.callback(hf_logging.enable_progress_bar)
    return stack


def lfm2_pair(sizes: Sizes) -> tuple[nn.Module, nn.Module, str]:
    """Our short_conv hybrid and transformers' Lfm2ForCausalLM holding its weights (exported with to_hf)."""
    import specformer_hf
    from transformers import AutoModelForCausalLM

    ours = build(spec(sizes, mixers(sizes)["short_conv"]))
    with tempfile.TemporaryDirectory() as folder, quiet():
        out = specformer_hf.to_hf(ours, Path(folder) / "model", family="lfm2")
        hf = AutoModelForCausalLM.from_pretrained(out)
    return ours, Logits(hf), "Lfm2ForCausalLM (model)"


def mamba2_pair(sizes: Sizes) -> tuple[nn.Module, nn.Module, str]:
    """transformers' Mamba2ForCausalLM (random, every layer Mamba-2, no feed-forward) and ours imported from it."""
    import specformer_hf
    from transformers import Mamba2Config, Mamba2ForCausalLM

    mixer = mixers(sizes)["mamba2"]
    config = Mamba2Config(vocab_size=sizes.vocab, hidden_size=sizes.d_model, num_hidden_layers=sizes.n_layers,
                          num_heads=mixer["n_heads"], head_dim=mixer["head_dim"], state_size=mixer["state_size"],
                          n_groups=1, expand=2, conv_kernel=4, chunk_size=256, tie_word_embeddings=True,
                          bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    hf = Mamba2ForCausalLM(config)
    with tempfile.TemporaryDirectory() as folder, quiet():
        hf.save_pretrained(folder)
        ours = specformer_hf.import_hf(folder).model
    return ours, Logits(hf), "Mamba2ForCausalLM (model)"


class DeltaNetLayer(nn.Module):
    """transformers' Qwen3NextGatedDeltaNet as ``x -> y`` (ForwardContext-free), for the module-level comparison."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: Tensor) -> Tensor:
        return self.layer(x)


class OurLayer(nn.Module):
    """One of our mixers as ``x -> y``, run as a model runs it without a cache."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: Tensor) -> Tensor:
        from specformer.model.context import ForwardContext

        positions = torch.arange(x.shape[1]).expand(x.shape[0], -1)
        return self.layer(x, ForwardContext(positions=positions, positional=None, plain_causal=True))  # type: ignore[arg-type]


def gated_deltanet_pair(sizes: Sizes) -> tuple[nn.Module, nn.Module, str]:
    """Our gated_deltanet layer and transformers' Qwen3NextGatedDeltaNet with the same weights (the module only:
    no Qwen3-Next family in this checkout to import a whole model through)."""
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    from specformer_layers.mixers.gated_deltanet import GatedDeltaNet
    from specformer_layers.mixers.gated_deltanet_params import GatedDeltaNetParams

    mixer = mixers(sizes)["gated_deltanet"]
    d, value_heads, key_heads = sizes.d_model, mixer["n_heads"], mixer["n_key_heads"]
    dk = dv = d // value_heads
    config = Qwen3NextConfig(hidden_size=d, num_hidden_layers=1, num_attention_heads=sizes.n_heads,
                             num_key_value_heads=sizes.n_kv_heads, linear_num_key_heads=key_heads,
                             linear_num_value_heads=value_heads, linear_key_head_dim=dk, linear_value_head_dim=dv,
                             linear_conv_kernel_dim=4, layer_types=["linear_attention"], vocab_size=sizes.vocab,
                             intermediate_size=sizes.hidden)
    torch.manual_seed(0)
    with quiet():
        theirs = Qwen3NextGatedDeltaNet(config, layer_idx=0)
    params = GatedDeltaNetParams(n_heads=value_heads, n_key_heads=key_heads, key_head_dim=dk, value_head_dim=dv)
    ours = GatedDeltaNet(params, d_model=d)
    r = value_heads // key_heads
    with torch.no_grad():
        # Qwen3-Next groups its fused rows per key head: [q (dk), k (dk), v (r*dv), z (r*dv)] and [b (r), a (r)].
        q, k, v, z = theirs.in_proj_qkvz.weight.view(key_heads, 2 * dk + 2 * r * dv, d).split((dk, dk, r * dv, r * dv), 1)
        ours.qkv.weight.copy_(torch.cat([q.reshape(-1, d), k.reshape(-1, d), v.reshape(-1, d)]))
        ours.z.weight.copy_(z.reshape(-1, d))
        b, a = theirs.in_proj_ba.weight.view(key_heads, 2 * r, d).split((r, r), dim=1)
        ours.b.weight.copy_(b.reshape(-1, d))
        ours.a.weight.copy_(a.reshape(-1, d))
        ours.conv_weight.copy_(theirs.conv1d.weight.squeeze(1))
        ours.A_log.copy_(theirs.A_log)
        ours.dt_bias.copy_(theirs.dt_bias)
        ours.norm.weight.copy_(theirs.norm.weight)
        ours.out.weight.copy_(theirs.out_proj.weight)
    return OurLayer(ours), DeltaNetLayer(theirs), "Qwen3NextGatedDeltaNet (layer)"


#: mixer -> what builds (ours, transformers' peer with the same weights, the peer's name).
TRAIN_PAIRS: dict[str, Callable[[Sizes], tuple[nn.Module, nn.Module, str]]] = {
    "short_conv": lfm2_pair, "gated_deltanet": gated_deltanet_pair, "mamba2": mamba2_pair}


def layer_step(model: nn.Module, opt: torch.optim.Optimizer, x: Tensor, y: Tensor) -> None:
    """A layer's training step: forward, a squared-error loss against ``y``, backward, AdamW."""
    loss = (model(x) - y).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def part_train(sizes: Sizes, names: list[str]) -> None:
    print(f"\n(c) training step (forward, backward, AdamW) against transformers with the same weights, batch "
          f"{sizes.train_batch} x {sizes.train_seq}: short_conv as a 3:1 LFM2 hybrid, mamba2 as a Mamba-2 model, "
          "gated_deltanet as one layer")
    print(f"{'mixer':<15} {'peer':<32} {'ours tok/s':>11} {'peer tok/s':>11} {'ratio':>6} {'max |out diff|':>15}")
    g = torch.Generator().manual_seed(2)
    tokens = sizes.train_batch * sizes.train_seq
    for name in names:
        try:
            ours, peer, label = TRAIN_PAIRS[name](sizes)
        except ImportError as exc:
            print(f"{name:<15} skipped: {exc}")
            continue
        layer = label.endswith("(layer)")
        if layer:
            x = torch.randn(sizes.train_batch, sizes.train_seq, sizes.d_model, generator=g)
            y = torch.randn(sizes.train_batch, sizes.train_seq, sizes.d_model, generator=g)
            step = layer_step
        else:
            x = torch.randint(0, sizes.vocab, (sizes.train_batch, sizes.train_seq), generator=g)
            y = torch.randint(0, sizes.vocab, (sizes.train_batch, sizes.train_seq), generator=g)
            step = train_step
        ours.train(), peer.train()
        with torch.no_grad(), quiet():
            difference = (ours(x) - peer(x)).abs().max().item()
        optimizers = {"ours": torch.optim.AdamW(ours.parameters(), lr=1e-4),
                      "peer": torch.optim.AdamW(peer.parameters(), lr=1e-4)}
        models = {"ours": ours, "peer": peer}

        def run(key: str) -> float:
            start = time.perf_counter()
            step(models[key], optimizers[key], x, y)
            return time.perf_counter() - start

        with quiet():
            times = alternate({k: (lambda k=k: run(k)) for k in models}, sizes.repeats)
        ours_tps, peer_tps = (median_rate(tokens, times[k]) for k in ("ours", "peer"))
        print(f"{name:<15} {label:<32} {ours_tps:>11,.0f} {peer_tps:>11,.0f} {ours_tps / peer_tps:>6.2f} "
              f"{difference:>15.2e}")


PARTS = {"decode": part_decode, "prefill": part_prefill, "train": part_train}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=[*PARTS, "all"], default="all")
    parser.add_argument("--quick", action="store_true", help="toy sizes: every part in seconds (the smoke test)")
    parser.add_argument("--mixer", choices=MIXERS, action="append", help="only this mixer (repeatable; default: all)")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs of each side (median kept)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's); 1 on a machine other jobs share, where waiting "
                             "threads slow every multi-threaded kernel down")
    args = parser.parse_args(argv)
    if args.threads is not None:
        if args.threads < 1:
            parser.error(f"--threads must be at least 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    sizes = QUICK if args.quick else FULL
    if args.repeats is not None:
        if args.repeats < 1:
            parser.error(f"--repeats must be at least 1, got {args.repeats}")
        sizes = Sizes(**{**sizes.__dict__, "repeats": args.repeats})
    torch.manual_seed(0)
    names, missing = available_mixers()
    if args.mixer:
        names = [name for name in names if name in args.mixer]
    print(f"torch {torch.__version__}, CPU fp32, {torch.get_num_threads()} threads; mixers: {', '.join(names)}"
          + (f" (not registered here, skipped: {', '.join(missing)})" if missing else ""))
    for name, part in PARTS.items():
        if args.part in (name, "all"):
            part(sizes, names)
    return 0


if __name__ == "__main__":
    sys.exit(main())
