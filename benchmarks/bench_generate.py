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
"""

from __future__ import annotations

import argparse
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
                "attention": {"kind": "attention", "n_heads": heads, "n_kv_heads": kv_heads},
                "ffn": {"kind": "swiglu", "hidden": hidden},
            },
        }
    }


def hf_llama_from(model: Any) -> Any:
    """A ``LlamaForCausalLM`` with ``model``'s weights (fused qkv / gate_up split back apart)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    spec, attn, ffn = model.spec.model, model.blocks[0].attention, model.blocks[0].ffn
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
            q, k, v = ours.attention.qkv.weight.split((H * hd, KV * hd, KV * hd))
            theirs.self_attn.q_proj.weight.copy_(q)
            theirs.self_attn.k_proj.weight.copy_(k)
            theirs.self_attn.v_proj.weight.copy_(v)
            theirs.self_attn.o_proj.weight.copy_(ours.attention.out.weight)
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


def best_of(fns: dict[str, Callable[[], Any]], *, repeats: int, device: torch.device) -> dict[str, tuple[float, float, Any]]:
    """Interleaved runs; per name (best seconds, median seconds, last output)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    outs: dict[str, Any] = {}
    for _ in range(repeats):
        for name, fn in fns.items():
            seconds, outs[name] = timed(fn, device)
            times[name].append(seconds)
    return {name: (min(t), statistics.median(t), outs[name]) for name, t in times.items()}


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

    cpu_bandwidth = cpu_read_bandwidth_gbs() if device.type == "cpu" else 0.0
    g = torch.Generator().manual_seed(0)
    header = (f"{'batch':>5}  {'who':<26} {'tokens/s':>10} {'(median)':>10}  {'ratio':>6} {'(median)':>9}  "
              f"{'same tokens':>11}")
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
        for name, run in runners.items():  # warm-up: allocator, kernels; compilation at the timed length
            run(n if "compile" in name else 8)
        results = best_of({name: (lambda run=run: run(n)) for name, run in runners.items()},
                          repeats=args.repeats, device=device)
        peer_best, peer_median, reference = results["transformers generate()"]
        for name, (best, median, out) in results.items():
            same = (out[:, PROMPT_LENGTH:] == reference[:, PROMPT_LENGTH:]).float().mean().item()
            print(f"{batch:>5}  {name:<26} {batch * n / best:>10.1f} {batch * n / median:>10.1f}  "
                  f"{peer_best / best:>5.2f}x {peer_median / median:>8.2f}x  {same:>10.1%}")
        cache = StaticKVCache.for_model(ours, batch_size=batch, capacity=PROMPT_LENGTH + n)
        memory_rows.append((batch, cache.nbytes))
        # Each decode step reads every weight once and the whole static cache buffer.
        step_bytes = sum(p.numel() * p.element_size() for p in ours.parameters()) + cache.nbytes
        achieved = step_bytes * n / results["specformer"][0] / 1e9
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
