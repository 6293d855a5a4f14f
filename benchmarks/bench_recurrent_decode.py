"""Decode speed of the recurrent families against transformers' own CPU path, and Mamba-1 against Mamba-2.

For each family (``mamba``, ``falcon_mamba``, ``mamba2``, ``recurrent_gemma``, ``rwkv``,
``minimax``) a transformers model of one small shape is built with random weights, saved, and
imported with ``specformer_hf.import_hf``; both then decode greedily at batch 1 from the same
prompt, ours through ``specformer_generate.generate`` (the static cache keeps each layer's
recurrent state), theirs through ``generate()`` (its own cache). Rounds alternate (ours,
theirs, ours, ...) so load on a shared machine hits both alike; the table prints the median
rate of each, the ratio, and the share of tokens that agree (random weights decode greedily to
the same tokens when the two compute the same logits).

A last table compares our Mamba-1 model with our Mamba-2 model of the same width, depth and
state size (issue 45 asks a Mamba-1 decode step to be within 1.2x of Mamba-2's).

``--prefill N`` adds the rwkv model's prefill of an N-token prompt into the cache, one forward
each: the chunked WKV (what runs) against the token loop (forced by raising rwkv4's
``RECURRENT_MAX_TOKENS`` past N) and transformers' forward (its CPU loop), with the largest
difference of the last logits.

    python benchmarks/bench_recurrent_decode.py --threads 1              # a few minutes on one core
    python benchmarks/bench_recurrent_decode.py --family rwkv --family mamba
    python benchmarks/bench_recurrent_decode.py --quick                  # toy sizes, seconds (the smoke test)
    python benchmarks/bench_recurrent_decode.py --family rwkv --prefill 2048 --threads 1   # rwkv prefill too
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch

from specformer_generate import generate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_generate import best_of  # noqa: E402
from bench_hybrid import quiet  # noqa: E402
from gpu_check import positive  # noqa: E402

FAMILIES = ("mamba", "falcon_mamba", "mamba2", "recurrent_gemma", "rwkv", "minimax")


def configs(*, vocab: int, d: int, layers: int, state: int, context: int = 1024) -> dict[str, Callable[[], Any]]:
    """family -> a transformers config of the shape given (no bos/eos: every run decodes all its tokens)."""
    import transformers as t

    none = dict(bos_token_id=None, eos_token_id=None, pad_token_id=0)
    heads = max(1, d // 64)
    return {
        "mamba": lambda: t.MambaConfig(vocab_size=vocab, hidden_size=d, num_hidden_layers=layers, state_size=state,
                                       expand=2, conv_kernel=4, **none),
        "falcon_mamba": lambda: t.FalconMambaConfig(vocab_size=vocab, hidden_size=d, num_hidden_layers=layers,
                                                    state_size=state, expand=2, conv_kernel=4, **none),
        "mamba2": lambda: t.Mamba2Config(vocab_size=vocab, hidden_size=d, num_hidden_layers=layers, state_size=state,
                                         num_heads=2 * d // 64, head_dim=64, n_groups=1, expand=2, conv_kernel=4,
                                         chunk_size=64, **none),
        "recurrent_gemma": lambda: t.RecurrentGemmaConfig(
            vocab_size=vocab, hidden_size=d, lru_width=d, intermediate_size=3 * d, num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=1, head_dim=d // heads, attention_window_size=256, **none),
        "rwkv": lambda: t.RwkvConfig(vocab_size=vocab, hidden_size=d, attention_hidden_size=d, intermediate_size=4 * d,
                                     num_hidden_layers=layers, context_length=max(1024, context), **none),
        "minimax": lambda: t.MiniMaxConfig(
            vocab_size=vocab, hidden_size=d, intermediate_size=2 * d, num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=heads, head_dim=d // heads, num_local_experts=4,
            num_experts_per_tok=2, block_size=64, layer_types=["linear_attention" if i % 4 != 3 else "full_attention"
                                                               for i in range(layers)], **none),
    }


def pair(family: str, make_config: Callable[[], Any]) -> tuple[Any, Any]:
    """transformers' model of ``family`` with random weights, and ours imported from its saved folder."""
    import specformer_hf
    import transformers

    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(make_config()).eval()
    with tempfile.TemporaryDirectory() as folder, quiet():
        hf.save_pretrained(folder)
        ours = specformer_hf.import_hf(folder).model.eval()
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    return ours, hf


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", action="append", choices=FAMILIES, help="one family (repeatable; default: all)")
    parser.add_argument("--d-model", type=positive(int), default=512)
    parser.add_argument("--layers", type=positive(int), default=8)
    parser.add_argument("--state", type=positive(int), default=16, help="state size of the Mamba families")
    parser.add_argument("--vocab", type=positive(int), default=8192)
    parser.add_argument("--prompt", type=positive(int), default=32)
    parser.add_argument("--new-tokens", type=positive(int), default=128)
    parser.add_argument("--repeats", type=positive(int), default=3)
    parser.add_argument("--threads", type=positive(int), default=None)
    parser.add_argument("--prefill", type=positive(int), default=None,
                        help="also time rwkv's prefill of this many tokens: chunked WKV, token loop, transformers")
    parser.add_argument("--quick", action="store_true", help="toy sizes (the smoke test)")
    args = parser.parse_args(argv)
    if args.quick:
        args.d_model, args.layers, args.vocab, args.prompt, args.new_tokens, args.repeats = 64, 4, 256, 8, 8, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    table = configs(vocab=args.vocab, d=args.d_model, layers=args.layers, state=args.state,
                    context=(args.prefill or 0) + 1)
    families = args.family or list(FAMILIES)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, CPU fp32, "
          f"{torch.get_num_threads()} threads; d_model {args.d_model}, {args.layers} layers, vocab {args.vocab}; "
          f"batch 1, greedy, prompt {args.prompt}, {args.new_tokens} new tokens, median of {args.repeats} rounds\n")
    print(f"{'family':<16} {'params':>8} {'ours tok/s':>11} {'transformers tok/s':>19} {'ratio':>6} {'same tokens':>12}")
    ids = torch.randint(1, args.vocab, (1, args.prompt), generator=torch.Generator().manual_seed(0))
    n = args.new_tokens
    ours_rates: dict[str, float] = {}
    models: dict[str, tuple[Any, Any]] = {}
    for family in families:
        ours, hf = models[family] = pair(family, table[family])
        runners = {
            "ours": lambda k, ours=ours: generate(ours, ids, max_new_tokens=k),
            "theirs": lambda k, hf=hf: hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=k,
                                                    min_new_tokens=k, do_sample=False),
        }
        with torch.no_grad(), quiet():
            for run in runners.values():  # warm-up
                run(4)
            results = best_of({name: (lambda run=run: run(n)) for name, run in runners.items()},
                              repeats=args.repeats, device=torch.device("cpu"))
        (ours_s, ours_out), (theirs_s, theirs_out) = results["ours"], results["theirs"]
        ours_rate, theirs_rate = n / statistics.median(ours_s), n / statistics.median(theirs_s)
        ours_rates[family] = ours_rate
        same = (ours_out[:, args.prompt:] == theirs_out[:, args.prompt:]).float().mean().item()
        params = sum(p.numel() for p in ours.parameters())
        print(f"{family:<16} {params / 1e6:>7.1f}M {ours_rate:>11,.1f} {theirs_rate:>19,.1f} "
              f"{ours_rate / theirs_rate:>6.2f} {same:>12.0%}")
    if {"mamba", "mamba2"} <= set(ours_rates):
        ratio = ours_rates["mamba2"] / ours_rates["mamba"]
        print(f"\nMamba-1 against Mamba-2 (ours, same width, depth and state {args.state}): a Mamba-1 step takes "
              f"{ratio:.2f}x a Mamba-2 step (goal: at most 1.2x)")
    if args.prefill and "rwkv" in models:
        prefill_forms(*models["rwkv"], vocab=args.vocab, length=args.prefill, repeats=args.repeats)
    return 0


def prefill_forms(ours: Any, hf: Any, *, vocab: int, length: int, repeats: int) -> None:
    """rwkv's prefill of ``length`` tokens, one forward each: chunked WKV, token loop, transformers'."""
    from specformer_generate import StaticKVCache
    from specformer_layers.mixers import rwkv4

    ids = torch.randint(1, vocab, (1, length), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(length)[None]
    decode_max, loop_devices = rwkv4.RECURRENT_MAX_TOKENS, rwkv4.LOOP_DEVICES

    def ours_with(*, chunked: bool) -> Callable[[], Any]:
        def run() -> Any:  # the form forced: every device chunked, or every forward a token loop
            rwkv4.RECURRENT_MAX_TOKENS, rwkv4.LOOP_DEVICES = (decode_max, frozenset()) if chunked else (length, loop_devices)
            try:
                cache = StaticKVCache.for_model(ours, batch_size=1, capacity=length)
                return ours(ids, positions=positions, cache=cache, last_only=True)[:, -1]
            finally:
                rwkv4.RECURRENT_MAX_TOKENS, rwkv4.LOOP_DEVICES = decode_max, loop_devices
        return run

    runners = {"chunked": ours_with(chunked=True), "token loop": ours_with(chunked=False),
               "transformers": lambda: hf(ids, use_cache=True).logits[:, -1]}
    with torch.inference_mode(), quiet():
        results = best_of(runners, repeats=repeats, device=torch.device("cpu"))
    print(f"\nrwkv prefill of a {length:,}-token prompt into the cache, one forward (median of {repeats}):")
    print(f"{'form':<14} {'seconds':>8} {'tok/s':>9} {'vs token loop':>14} {'max |last logit diff| vs chunked':>33}")
    loop_s = statistics.median(results["token loop"][0])
    for name, (seconds, out) in results.items():
        median = statistics.median(seconds)
        diff = (out - results["chunked"][1]).abs().max().item()
        print(f"{name:<14} {median:>8.2f} {length / median:>9,.0f} {loop_s / median:>13.1f}x {diff:>33.2e}")


if __name__ == "__main__":
    raise SystemExit(main())
