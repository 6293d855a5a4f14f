"""Serving speed: N concurrent clients against the same requests one at a time, and against transformers.

A random Llama-shaped model with the byte tokenizer is saved as a checkpoint and served by
``specformer serve`` in a subprocess on 127.0.0.1 (``--ignore-eos``, so every request
produces exactly ``--max-tokens`` tokens). The same ``--requests`` prompts (16 to 48
tokens, greedy) are then sent

- one at a time (sequential: what a server without batching does),
- by ``--clients`` concurrent clients (continuous batching),

each streamed, and a plain transformers loop runs ``LlamaForCausalLM.generate`` on the same
weights over the same prompts in batches of ``--clients`` (left-padded, the usual way to
batch offline with transformers; no server, no HTTP). Printed: aggregate tokens/s and the
ratio to the sequential figure, time to first token and inter-token latency percentiles
(each streamed chunk carries its new tokens' ids, so latencies are per token), and whether
the concurrent results equal the sequential ones token for token.

    python benchmarks/bench_serve.py                        # CPU, d_model 256, 4 layers, ~2 min on 2 cores
    python benchmarks/bench_serve.py --clients 16 --requests 48 --max-tokens 64 --threads 2
    python benchmarks/bench_serve.py --d-model 512 --layers 8 --no-transformers

The server and the clients share the machine's cores; ``--threads`` sets the server's
(and the transformers loop's) PyTorch threads.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import torch

import specformer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_generate import hf_llama_from, llama_spec  # noqa: E402  (same weights into a LlamaForCausalLM)

MODEL_ID = "bench"


def start_server(checkpoint: Path, *, max_batch: int, threads: int) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-m", "specformer.cli", "serve", str(checkpoint), "--port", "0", "--ignore-eos",
               "--model-name", MODEL_ID, "--max-batch", str(max_batch), "--threads", str(threads)]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    line = process.stderr.readline()
    found = re.search(r"on (http://\S+) \(", line)
    if not found:
        process.kill()
        raise SystemExit(f"the server did not start: {line}{process.stderr.read()}")
    return process, found.group(1)


def one_request(client: httpx.Client, url: str, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    """Stream one completion; the arrival time of each token, and the tokens."""
    body = {"model": MODEL_ID, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "return_token_ids": True}
    start = time.perf_counter()
    arrivals: list[float] = []
    tokens: list[int] = []
    with client.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk["choices"]:
                now = time.perf_counter()
                new = choice.get("token_ids") or []  # each chunk carries its new tokens' ids
                arrivals += [now] * len(new)
                tokens += new
    return {"start": start, "arrivals": arrivals, "tokens": tokens}


def run_clients(url: str, prompts: list[list[int]], max_tokens: int, clients: int) -> tuple[float, list[dict[str, Any]]]:
    """``clients`` threads take the requests in order; wall seconds and each request's record."""
    jobs: queue.Queue = queue.Queue()
    for i, prompt in enumerate(prompts):
        jobs.put((i, prompt))
    results: list[dict[str, Any]] = [{} for _ in prompts]

    def worker() -> None:
        with httpx.Client() as client:
            while True:
                try:
                    i, prompt = jobs.get_nowait()
                except queue.Empty:
                    return
                results[i] = one_request(client, url, prompt, max_tokens)

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start, results


def percentiles(values: list[float]) -> str:
    if not values:
        return "-"
    q = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else values * 99
    return f"{q[49] * 1000:7.1f} {q[89] * 1000:7.1f} {q[98] * 1000:7.1f}"


def latencies(results: list[dict[str, Any]]) -> tuple[list[float], list[float]]:
    ttft = [r["arrivals"][0] - r["start"] for r in results if r["arrivals"]]
    itl = [b - a for r in results for a, b in zip(r["arrivals"], r["arrivals"][1:])]
    return ttft, itl


def transformers_loop(model: Any, prompts: list[list[int]], max_tokens: int, batch: int) -> tuple[float, int]:
    """LlamaForCausalLM.generate over the prompts in left-padded batches of ``batch``; seconds and tokens made."""
    hf = hf_llama_from(model)
    made, start = 0, time.perf_counter()
    with torch.inference_mode():
        for first in range(0, len(prompts), batch):
            group = prompts[first:first + batch]
            width = max(map(len, group))
            ids = torch.tensor([[0] * (width - len(p)) + p for p in group])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group])
            out = hf.generate(ids, attention_mask=mask, max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                              do_sample=False, pad_token_id=0)
            made += (out.shape[1] - width) * len(group)
    return time.perf_counter() - start, made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=max(1, min(2, os.cpu_count() or 1)))
    parser.add_argument("--no-transformers", action="store_true", help="skip the transformers loop")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    d = args.d_model
    spec = llama_spec(vocab=259, d=d, layers=args.layers, heads=max(1, d // 64), kv_heads=max(1, d // 128),
                      hidden=int(d * 8 / 3) // 64 * 64 or 64, context=512)
    model = specformer.build(spec, seed=0).eval()
    rng = random.Random(0)
    prompts = [[rng.randrange(256) for _ in range(rng.randrange(16, 49))] for _ in range(args.requests)]
    total_tokens = args.requests * args.max_tokens
    load = os.getloadavg()
    print(f"torch {torch.__version__}, {args.threads} thread(s); Llama-shaped d_model={d}, {args.layers} layers, "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters; {args.requests} requests of "
          f"{args.max_tokens} new tokens, prompts 16-48 tokens, greedy")

    with tempfile.TemporaryDirectory() as folder:
        checkpoint = Path(folder) / "bench.safetensors"
        specformer.save(model, checkpoint)
        process, url = start_server(checkpoint, max_batch=args.clients, threads=args.threads)
        try:
            run_clients(url, prompts[:2], 4, 1)  # warm-up
            seq_seconds, seq = run_clients(url, prompts, args.max_tokens, 1)
            con_seconds, con = run_clients(url, prompts, args.max_tokens, args.clients)
            stats = httpx.get(f"{url}/v1/stats").json()
        finally:
            process.terminate()
            process.wait(timeout=30)
            process.stderr.close()

    seq_rate, con_rate = total_tokens / seq_seconds, total_tokens / con_seconds
    same = all(a["tokens"] == b["tokens"] for a, b in zip(seq, con))
    print(f"\n{'who':<42} {'tokens/s':>9} {'ratio':>6}   {'TTFT ms p50 p90 p99':>23}   {'ITL ms p50 p90 p99':>23}")
    for name, rate, results in (("specformer serve, 1 client (sequential)", seq_rate, seq),
                                (f"specformer serve, {args.clients} concurrent clients", con_rate, con)):
        ttft, itl = latencies(results)
        print(f"{name:<42} {rate:9.1f} {rate / seq_rate:6.2f}   {percentiles(ttft):>23}   {percentiles(itl):>23}")
    if not args.no_transformers:
        hf_seconds, made = transformers_loop(model, prompts, args.max_tokens, args.clients)
        rate = made / hf_seconds
        print(f"{f'transformers generate(), batches of {args.clients}':<42} {rate:9.1f} {rate / seq_rate:6.2f}   "
              f"{'(offline, no streaming)':>23}")
        print(f"\nspecformer serve concurrent / transformers batched: {con_rate / rate:.2f}")
    print(f"concurrent results identical to sequential: {'yes' if same else 'NO'}; largest decode batch "
          f"{stats['largest_batch']}, KV blocks free after the run {stats['free_blocks']}/{stats['total_blocks']}")
    print(f"load average before / after: {load[0]:.1f} / {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
