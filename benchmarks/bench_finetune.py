"""LoRA fine-tuning steps against full fine-tuning and against peft + transformers, on the same model and batches.

A random Llama is built with transformers, saved, and imported (``specformer_hf.import_hf``),
so both sides hold the same weights. Four training steps are timed, each forward + cross-entropy
+ backward + AdamW step on the same random batches, fp32 (bf16 autocast on CUDA):

- ``ours LoRA``: ``train.adapter``'s LoRA (rank r on every attention and FFN linear layer:
  ``blocks.*.mixer.*``, ``blocks.*.ffn.*``), the base frozen;
- ``ours full``: every parameter trained (what ``train --init`` without an adapter does);
- ``peft LoRA``: ``peft.get_peft_model`` on the transformers model, rank r on q/k/v/o and
  gate/up/down (peft adapts q, k and v separately where we adapt the fused projection, so it
  trains a few more adapter parameters at the same rank; both are printed);
- ``hf full``: the transformers model, every parameter trained.

Rounds of each alternate and the median counts, so other load hits all alike. Printed per
mode: tokens/s (wall clock) and, on CPU, CPU tokens/s (the tokens over the process' CPU
time, which other processes' load barely moves: on a shared machine compare these, best
with ``--threads 1``, where no worker thread spins), trainable parameters, optimizer state
bytes (AdamW's moments after a step), and the peak memory of a step (CUDA:
``max_memory_allocated``; CPU: the rise of the process' RSS, sampled every 0.5 ms, over a
few steps run in a fresh process per mode: activations, gradients and optimizer state, the
weights already resident). Targets: LoRA at least as fast as peft, optimizer state at most
5% of full fine-tuning's.

    python benchmarks/bench_finetune.py [--d-model 512] [--layers 4] [--vocab 4096] [--batch 8] [--seq 256]
                                        [--rank 8] [--steps 5] [--rounds 5] [--threads N] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

MODES = ("ours LoRA", "ours full", "peft LoRA", "hf full")


def build(args: argparse.Namespace, folder: Path) -> tuple[Any, Any]:
    """(our Decoder, the transformers model) with the same random weights."""
    import transformers

    from specformer_hf import import_hf

    config = transformers.LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.d_model, intermediate_size=args.d_model * 8 // 3 // 64 * 64,
        num_hidden_layers=args.layers, num_attention_heads=args.d_model // 64, num_key_value_heads=args.d_model // 128,
        max_position_embeddings=args.seq, tie_word_embeddings=False, attn_implementation="sdpa")
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config)
    hf.save_pretrained(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no tokenizer in the folder: only the model is wanted
        ours = import_hf(folder).model
    return ours, hf


def prepare(mode: str, ours: Any, hf: Any, rank: int) -> tuple[torch.nn.Module, Callable[[torch.Tensor], torch.Tensor]]:
    """The module a mode trains and its forward (ids -> logits)."""
    if mode == "ours LoRA":
        from specformer_finetune import apply_adapter

        apply_adapter(ours, {"kind": "lora", "rank": rank, "alpha": 2 * rank,
                             "targets": ["blocks.*.mixer.*", "blocks.*.ffn.*"]})
        return ours, ours
    if mode == "ours full":
        return ours, ours
    if mode == "peft LoRA":
        import peft

        config = peft.LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=[
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
        tuned = peft.get_peft_model(hf, config)
        return tuned, lambda ids: tuned(input_ids=ids).logits
    return hf, lambda ids: hf(input_ids=ids).logits


def step_fn(module: torch.nn.Module, forward: Callable, batches: list[torch.Tensor], device: torch.device
            ) -> tuple[Callable[[], None], torch.optim.Optimizer]:
    module.to(device).train()
    trainable = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4, foreach=True)
    state = {"i": 0}
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else None

    def step() -> None:
        batch = batches[state["i"] % len(batches)]
        state["i"] += 1
        if autocast is not None:
            with autocast:
                logits = forward(batch[:, :-1])
        else:
            logits = forward(batch[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()

    return step, optimizer


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(v.numel() * v.element_size() for s in optimizer.state.values() for v in s.values()
               if isinstance(v, torch.Tensor))


def measure_memory(args: argparse.Namespace, mode: str) -> int:
    """Bytes: the peak memory a few steps of ``mode`` add (run in this process; CPU: peak RSS rise)."""
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        ours, hf = build(args, Path(tmp))
        module, forward = prepare(mode, ours, hf, args.rank)
        other = hf if mode.startswith("ours") else ours
        del other
        batches = [torch.randint(0, args.vocab, (args.batch, args.seq + 1), device=device) for _ in range(2)]
        step, _ = step_fn(module, forward, batches, device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
            start = torch.cuda.memory_allocated()
            for _ in range(3):
                step()
            return torch.cuda.max_memory_allocated() - start
        # The process' high-water mark was set while building and importing; sample RSS during the steps instead.
        start, peak = _rss(), [0]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], _rss())
                time.sleep(0.0005)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            for _ in range(3):
                step()
        finally:
            done.set()
            sampler.join()
        return max(peak[0], _rss()) - start


def _rss() -> int:
    """Resident bytes of this process now (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--memory-of", choices=MODES, help=argparse.SUPPRESS)  # the per-mode child process
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_of:
        print(json.dumps({"bytes": measure_memory(args, args.memory_of)}))
        return

    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        ours, hf = build(args, Path(tmp))
        ours_full, hf_full = build(args, Path(tmp) / "again")
    models = {"ours LoRA": (ours, hf), "ours full": (ours_full, None), "peft LoRA": (None, hf), "hf full": (None, hf_full)}
    batches = [torch.randint(0, args.vocab, (args.batch, args.seq + 1), device=device,
                             generator=None) for _ in range(4)]
    steps: dict[str, Callable[[], None]] = {}
    info: dict[str, dict[str, Any]] = {}
    for mode in MODES:
        a, b = models[mode]
        module, forward = prepare(mode, a, b, args.rank)
        step, optimizer = step_fn(module, forward, batches, device)
        for _ in range(2):  # warm-up; AdamW's state exists after the first
            step()
        steps[mode] = step
        info[mode] = {"trainable": sum(p.numel() for p in module.parameters() if p.requires_grad),
                      "state": state_bytes(optimizer)}
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    cpu: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(args.rounds):
        for mode, step in steps.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            for _ in range(args.steps):
                step()
            times[mode].append((time.perf_counter() - start) / args.steps)
            cpu[mode].append((time.process_time() - start_cpu) / args.steps)
    tokens = args.batch * args.seq
    for mode in MODES:
        child = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--memory-of", mode], capture_output=True,
                               text=True, check=True)
        info[mode]["memory"] = json.loads(child.stdout.strip().splitlines()[-1])["bytes"]
        info[mode]["tokens_per_s"] = tokens / statistics.median(times[mode])
        info[mode]["cpu_tokens_per_s"] = tokens / statistics.median(cpu[mode])

    total = sum(p.numel() for p in ours_full.parameters())
    print(f"Llama d_model {args.d_model}, {args.layers} layers, vocab {args.vocab}: {total:,} parameters; batch "
          f"{args.batch} x {args.seq} tokens, LoRA rank {args.rank}; {device}"
          + (f", {torch.get_num_threads()} threads" if device.type == "cpu" else ", bf16 autocast"))
    print(f"{'':<11} {'tokens/s':>10} {'CPU tokens/s':>13} {'trainable':>12} {'optimizer state':>16} "
          f"{'peak step memory':>17}")
    for mode in MODES:
        i = info[mode]
        print(f"{mode:<11} {i['tokens_per_s']:>10,.0f} {i['cpu_tokens_per_s']:>13,.0f} {i['trainable']:>12,} "
              f"{i['state'] / 2**20:>12.2f} MiB {i['memory'] / 2**20:>13.1f} MiB")
    lora, full, peft_ = info["ours LoRA"], info["ours full"], info["peft LoRA"]
    print(f"ours LoRA / peft LoRA speed: {lora['tokens_per_s'] / peft_['tokens_per_s']:.2f}x wall clock, "
          f"{lora['cpu_tokens_per_s'] / peft_['cpu_tokens_per_s']:.2f}x CPU time (target >= 1.0)")
    print(f"ours LoRA / ours full speed: {lora['tokens_per_s'] / full['tokens_per_s']:.2f}x")
    print(f"LoRA optimizer state / full: {100 * lora['state'] / full['state']:.2f}% (target <= 5%)")


if __name__ == "__main__":
    main()
