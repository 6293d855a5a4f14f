"""Decode speed of specformer_generate against Hugging Face transformers' ``generate()``.

Same Llama-architecture weights on both sides (RoPE, RMSNorm, SwiGLU, GQA; copied into a
``LlamaForCausalLM``), greedy decoding, a 16-token prompt and a fixed number of new
tokens (no end token, so both produce every token). Prints decode tokens/s for each
batch size and the ratio specformer / transformers; the cache's memory; the speed-up of
the KV cache over recomputing the whole sequence every token; and on CUDA the achieved
memory bandwidth against the card's (decode reads every weight and the cache once per
step, so tokens/s <= bandwidth / bytes per step). Runs alternate (ours, theirs, ours,
...) and the best of ``--repeats`` is kept, so load on a shared machine hits both.

    python benchmarks/bench_generate.py                       # CPU fp32, ~3 min on 2 cores
    python benchmarks/bench_generate.py --compile             # also torch.compile'd decode step
    python benchmarks/bench_generate.py --d-model 1024 --layers 16 --batches 1 8 32 --repeats 3
    python benchmarks/bench_generate.py --device cuda --dtype bfloat16
    python benchmarks/bench_generate.py --no-fast    # only specformer fp32 against transformers

Rows beyond plain decoding (``--no-fast`` drops them): the same weights quantized (int8
twice: the default per-row activation scales and ``dynamic_activations``, one scale per
call; int4 group 32 and group 128; int4 group 32 with an int8 LM head; bf16; the tied LM
head quantized as a copy, the embedding kept float for lookups) and speculative decoding
with prompt lookup and with a draft model about a tenth of the target's size, with the
tokens each verifying forward yields (acceptance). "read per step" counts the bytes a decode step reads (weights at
their stored size, one row per sequence of a table only looked up, the KV cache);
"spread" is the lowest and highest ratio over the interleaved rounds. The weights are random, so a draft
model agrees with the target only by chance.

Prompt lookup runs on the same 16-token prompt as every other row, beside ``transformers``'
own prompt lookup (``prompt_lookup_num_tokens``, batch 1 only: transformers' assisted
generation takes one sequence). What it gets to copy: the random model's greedy output is
one token repeated (a period-1 loop, for any prompt), so from the second new token on the
n-gram drafter finds every draft in the text so far and nearly all are accepted. That is
prompt lookup's best case, like copying a quoted source verbatim; on real text acceptance
depends on how much the output repeats its input. The figure that carries over is printed
beside it: what one verifying forward of ``K + 1`` tokens costs in one-token decode steps
(speed-up = tokens per verifying forward / that cost).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from typing import Any, Callable

import torch

import specformer
from specformer_generate import StaticKVCache, generate

PROMPT_LENGTH = 16


def llama_spec(*, vocab: int, d: int, layers: int, heads: int, kv_heads: int, hidden: int, context: int) -> dict:
    return {
        "model": {
            "vocab_size": vocab,
            "d_model": d,
            "n_layers": layers,
            "context_length": context,
            "positional": {"kind": "rope", "theta": 10000.0},
            "block": {
                "layout": "prenorm",
                "norm": {"kind": "rmsnorm", "eps": 1e-5},
                "mixer": {"kind": "attention", "n_heads": heads, "n_kv_heads": kv_heads},
                "ffn": {"kind": "swiglu", "hidden": hidden},
            },
        }
    }


def hf_llama_from(model: Any) -> Any:
    """A ``LlamaForCausalLM`` with ``model``'s weights (fused qkv / gate_up split back apart)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    spec, attn, ffn = model.spec.model, model.blocks[0].mixer, model.blocks[0].ffn
    config = LlamaConfig(
        vocab_size=spec.vocab_size, hidden_size=spec.d_model, intermediate_size=ffn.hidden,
        num_hidden_layers=spec.n_layers, num_attention_heads=attn.n_heads, num_key_value_heads=attn.n_kv_heads,
        head_dim=attn.head_dim, max_position_embeddings=spec.context_length, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    reference = next(model.parameters())
    hf = LlamaForCausalLM(config).to(device=reference.device, dtype=reference.dtype).eval()
    H, KV, hd = attn.n_heads, attn.n_kv_heads, attn.head_dim
    with torch.no_grad():
        hf.model.embed_tokens.weight.copy_(model.embedding.weight)
        for ours, theirs in zip(model.blocks, hf.model.layers):
            q, k, v = ours.mixer.qkv.weight.split((H * hd, KV * hd, KV * hd))
            theirs.self_attn.q_proj.weight.copy_(q)
            theirs.self_attn.k_proj.weight.copy_(k)
            theirs.self_attn.v_proj.weight.copy_(v)
            theirs.self_attn.o_proj.weight.copy_(ours.mixer.out.weight)
            gate, up = ours.ffn.gate_up.weight.chunk(2)
            theirs.mlp.gate_proj.weight.copy_(gate)
            theirs.mlp.up_proj.weight.copy_(up)
            theirs.mlp.down_proj.weight.copy_(ours.ffn.down.weight)
            theirs.input_layernorm.weight.copy_(ours.attention_norm.weight)
            theirs.post_attention_layernorm.weight.copy_(ours.ffn_norm.weight)
        hf.model.norm.weight.copy_(model.final_norm.weight)
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    return hf


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: torch.device) -> tuple[float, Any]:
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - start, out


def best_of(fns: dict[str, Callable[[], Any]], *, repeats: int, device: torch.device) -> dict[str, tuple[list[float], Any]]:
    """Interleaved runs (every runner once per round); per name (seconds of each round, last output)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    outs: dict[str, Any] = {}
    for _ in range(repeats):
        for name, fn in fns.items():
            seconds, outs[name] = timed(fn, device)
            times[name].append(seconds)
    return {name: (t, outs[name]) for name, t in times.items()}


def card_bandwidth_gbs(device: torch.device, override: float | None) -> float | None:
    """Peak memory bandwidth of the GPU in GB/s: from the flag, the driver, or a table of known cards."""
    if override:
        return override
    props = torch.cuda.get_device_properties(device)
    clock_khz, bus_bits = getattr(props, "memory_clock_rate", 0), getattr(props, "memory_bus_width", 0)
    if clock_khz and bus_bits:
        return 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9  # double data rate
    known = {"H200": 4800, "H100 SXM": 3350, "H100 PCIe": 2000, "H100": 3350, "A100-SXM4-80GB": 2039,
             "A100 80GB PCIe": 1935, "A100": 1555, "L40S": 864, "L4": 300, "A10G": 600, "A10": 600, "T4": 320,
             "V100": 900, "RTX 4090": 1008, "RTX 3090": 936}
    return next((gbs for name, gbs in known.items() if name in props.name), None)


def cpu_read_bandwidth_gbs() -> float:
    """Read bandwidth of this CPU as torch sees it: summing a 256 MiB tensor, best of 5."""
    data = torch.ones(64 * 2**20)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - start)
    return data.numel() * 4 / best / 1e9


def read_per_step(model: Any, batch: int) -> int:
    """Bytes of weights one decode step reads: every parameter and buffer (quantized weights at their stored
    size), except an embedding table the logits do not come from, of which the step reads ``batch`` rows."""
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    table = model.embedding.weight
    if model.lm_head is not None:  # untied, or a quantized copy of a tied head: the table is only looked up
        total -= table.numel() * table.element_size() - batch * table.shape[1] * table.element_size()
    return total


def fast_variants(ours: Any, shape: dict, *, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """Quantized copies of ``ours`` and a draft model about a tenth of its size (same vocabulary)."""
    from specformer_quant import quantize

    quantized = {}
    int4 = {"kind": "int4", "group_size": 32}
    for name, scheme, head in (("int8", "int8", None), ("int8 dynamic", {"kind": "int8", "dynamic_activations": True}, None),
                               ("int4", int4, None), ("int4 g128", {"kind": "int4", "group_size": 128}, None),
                               ("int4 int8-head", int4, "int8"), ("bf16", "bf16", None)):
        model = copy.deepcopy(ours)
        quantize(model, scheme, quantize_lm_head=True, lm_head_scheme=head)
        quantized[name] = model
    d = max(64, shape["d"] // 4)
    small = dict(shape, d=d, layers=max(1, shape["layers"] // 4), heads=max(1, d // 64), kv_heads=max(1, d // 128),
                 hidden=-(-int(8 * d / 3) // 64) * 64)
    draft = specformer.build(llama_spec(**small), seed=1, device=device, dtype=dtype).eval()
    ratio = sum(p.numel() for p in draft.parameters()) / sum(p.numel() for p in ours.parameters())
    print(f"draft model: Llama d={d} layers={small['layers']}, {ratio:.0%} of the target's parameters")
    return {"quantized": quantized, "draft": draft}


def tokens_per_forward(model: Any, ids: torch.Tensor, n: int, draft: Any, k: int) -> float:
    """New tokens per forward of ``model`` (prefill excluded) in one speculative run."""
    calls = [0]
    handle = model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    try:
        generate(model, ids, max_new_tokens=n, draft=draft, draft_tokens=k)
    finally:
        handle.remove()
    return (n - 1) / max(calls[0] - 1, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=1408, help="SwiGLU inner width (8/3 d rounded to 64)")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--recompute-tokens", type=int, default=512, help="new tokens for cache vs recompute")
    parser.add_argument("--recompute-d-model", type=int, default=256,
                        help="width of the (smaller, same-architecture) model for cache vs recompute: recompute "
                             "is quadratic and takes minutes at full size on a laptop CPU")
    parser.add_argument("--recompute-layers", type=int, default=4, help="layers of that model")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--compile", action="store_true", help="also time the torch.compile'd decode step")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--bandwidth-gbs", type=float, default=None, help="the card's peak bandwidth, if not detected")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--no-fast", action="store_true", help="skip the quantized and speculative rows")
    parser.add_argument("--draft-tokens", type=int, default=4, help="tokens drafted per speculative round")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    import transformers

    shape = dict(vocab=args.vocab, d=args.d_model, layers=args.layers, heads=args.heads, kv_heads=args.kv_heads,
                 hidden=args.hidden, context=max(2048, PROMPT_LENGTH + args.recompute_tokens))
    ours = specformer.build(llama_spec(**shape), seed=0, device=device, dtype=dtype).eval()
    theirs = hf_llama_from(ours)
    n_params = sum(p.numel() for p in ours.parameters())
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, device {device}, {args.dtype}, "
          f"{torch.get_num_threads()} CPU threads")
    print(f"model: Llama d={args.d_model} layers={args.layers} heads={args.heads}/{args.kv_heads} "
          f"hidden={args.hidden} vocab={args.vocab}: {n_params / 1e6:.1f}M params")
    print(f"greedy, prompt {PROMPT_LENGTH} tokens, {args.new_tokens} new tokens, best of {args.repeats} interleaved runs\n")

    variants = {} if args.no_fast else fast_variants(ours, shape, device=device, dtype=dtype)
    cpu_bandwidth = cpu_read_bandwidth_gbs() if device.type == "cpu" else 0.0
    g = torch.Generator().manual_seed(0)
    header = (f"{'batch':>5}  {'who':<26} {'tokens/s':>10} {'(median)':>10}  {'ratio':>6} {'(median)':>9}  "
              f"{'spread':>11} {'same tokens':>11}  {'read per step':>15} {'achieved':>9}")
    print(header)
    print("-" * len(header))
    memory_rows = []
    for batch in args.batches:
        ids = torch.randint(0, args.vocab, (batch, PROMPT_LENGTH), generator=g).to(device)
        n = args.new_tokens
        runners: dict[str, Callable[[int], Any]] = {
            "specformer": lambda k: generate(ours, ids, max_new_tokens=k),
            "transformers generate()": lambda k: theirs.generate(ids, attention_mask=torch.ones_like(ids),
                                                                 max_new_tokens=k, min_new_tokens=k, do_sample=False),
        }
        if args.compile:
            runners["specformer compile=True"] = lambda k: generate(ours, ids, max_new_tokens=k, compile=True)
        for name, model in variants.get("quantized", {}).items():
            runners[f"specformer {name}"] = lambda k, model=model: generate(model, ids, max_new_tokens=k)
        if variants:
            K = args.draft_tokens
            runners["specformer draft model"] = lambda k: generate(ours, ids, max_new_tokens=k, draft=variants["draft"],
                                                                   draft_tokens=K)
            runners["specformer prompt lookup"] = lambda k: generate(ours, ids, max_new_tokens=k, draft="ngram",
                                                                     draft_tokens=K)
            if batch == 1:  # transformers' assisted generation takes one sequence
                runners["transformers prompt lookup"] = lambda k: theirs.generate(
                    ids, attention_mask=torch.ones_like(ids), max_new_tokens=k, min_new_tokens=k, do_sample=False,
                    prompt_lookup_num_tokens=K)
        for name, run in runners.items():  # warm-up: allocator, kernels; compilation at the timed length
            run(n if "compile" in name else 8)
        results = best_of({name: (lambda run=run: run(n)) for name, run in runners.items()},
                          repeats=args.repeats, device=device)
        peer_times, reference = results["transformers generate()"]
        peer_best, peer_median = min(peer_times), statistics.median(peer_times)
        cache = StaticKVCache.for_model(ours, batch_size=batch, capacity=PROMPT_LENGTH + n)
        for name, (seconds, out) in results.items():
            best, median = min(seconds), statistics.median(seconds)
            ratios = [theirs_s / ours_s for theirs_s, ours_s in zip(peer_times, seconds)]  # same round
            same = (out[:, PROMPT_LENGTH:] == reference[:, PROMPT_LENGTH:]).float().mean().item()
            model = variants.get("quantized", {}).get(name.replace("specformer ", ""), ours)
            step_bytes = read_per_step(model, batch) + cache.nbytes
            over_plain = ""
            if "prompt lookup" in name or "draft" in name:  # against plain specformer decoding, same rounds
                plain_times = results["specformer"][0]
                over_plain = (f"  ({statistics.median(plain_times) / median:.2f}x over specformer plain, rounds "
                              f"{min(p / s for p, s in zip(plain_times, seconds)):.2f}.."
                              f"{max(p / s for p, s in zip(plain_times, seconds)):.2f})")
            print(f"{batch:>5}  {name:<26} {batch * n / best:>10.1f} {batch * n / median:>10.1f}  "
                  f"{peer_best / best:>5.2f}x {peer_median / median:>8.2f}x {min(ratios):>5.2f}..{max(ratios):<5.2f} "
                  f"{same:>10.1%}  {step_bytes / 1e6:>7.1f} MB/step {step_bytes * n / best / 1e9:>6.1f} GB/s"
                  + over_plain)
        if variants:
            plain_step = statistics.median(results["specformer"][0]) / n  # seconds per one-token step
            for name, draft in (("draft model", variants["draft"]), ("prompt lookup", "ngram")):
                per_forward = tokens_per_forward(ours, ids, n, draft, args.draft_tokens)
                # Seconds of a round (drafting and verifying) per plain step: time per token x tokens per round.
                round_cost = statistics.median(results[f"specformer {name}"][0]) / n * per_forward / plain_step
                print(f"       {name}: {per_forward:.2f} tokens per verifying forward of the target (1.00 = every "
                      f"draft rejected, {args.draft_tokens + 1} = every draft accepted); a round (drafting and "
                      f"one {args.draft_tokens + 1}-token verifying forward) costs {round_cost:.2f} plain steps")
        memory_rows.append((batch, cache.nbytes))
        # Each decode step reads every weight once and the whole static cache buffer.
        step_bytes = read_per_step(ours, batch) + cache.nbytes
        achieved = step_bytes * n / min(results["specformer"][0]) / 1e9
        if device.type == "cuda":
            peak = card_bandwidth_gbs(device, args.bandwidth_gbs)
            share = f" = {achieved / peak:.0%} of the card's {peak:.0f} GB/s" if peak else " (peak unknown: --bandwidth-gbs)"
        else:
            peak = cpu_bandwidth
            share = f"; this CPU reads {peak:.1f} GB/s, so at most {peak * 1e9 / step_bytes:.1f} steps/s"
        print(f"       a step reads {step_bytes / 1e6:.1f} MB: specformer achieves {achieved:.1f} GB/s{share}")
    print()
    for batch, nbytes in memory_rows:
        print(f"KV cache, batch {batch}, {PROMPT_LENGTH}+{args.new_tokens} slots: {nbytes / 2**20:.2f} MiB "
              f"(static buffers sized to prompt + new tokens, not the {shape['context']}-token context)")

    d_small = args.recompute_d_model
    small = dict(shape, d=d_small, layers=args.recompute_layers, heads=max(d_small // 64, 1),
                 kv_heads=max(d_small // 128, 1), hidden=-(-int(8 * d_small / 3) // 64) * 64)
    model = specformer.build(llama_spec(**small), seed=0, device=device, dtype=dtype).eval()
    ids = torch.randint(0, args.vocab, (1, PROMPT_LENGTH), generator=g).to(device)
    n = args.recompute_tokens
    generate(model, ids, max_new_tokens=8)
    generate(model, ids, max_new_tokens=8, use_cache=False)
    cached_s, cached = timed(lambda: generate(model, ids, max_new_tokens=n), device)
    recompute_s, recomputed = timed(lambda: generate(model, ids, max_new_tokens=n, use_cache=False), device)
    agree = (cached == recomputed).float().mean().item()
    print(f"\ncache vs recompute, {n} new tokens, batch 1, Llama d={small['d']} layers={small['layers']}: "
          f"cache {n / cached_s:.1f} tokens/s, recompute {n / recompute_s:.1f} tokens/s, "
          f"speed-up {recompute_s / cached_s:.1f}x (same tokens: {agree:.1%})")


if __name__ == "__main__":
    main()
