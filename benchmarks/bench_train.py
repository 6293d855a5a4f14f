"""Training throughput against Hugging Face transformers' LlamaForCausalLM of the same configuration.

Both models are built from specs/tiny.yaml's shape (RoPE, RMSNorm, grouped-query
attention, SwiGLU, tied embeddings; same parameter count, printed), trained on the
same random batches, fp32, with the same AdamW (weight decay on matrices), gradient
clipping and cross-entropy. Ours is timed through the Trainer's own optimizer step
(batch fetch included); the peer through the equivalent hand-written loop. Rounds of
each alternate, and the median round counts, so other load on the machine hits both
alike. Printed: tokens/s of each and the ratio, for ours eager and ours with
``torch.compile`` (train.compile: true; the default on CUDA). On CUDA the run uses
bf16 autocast for both and also prints MFU.

Then one row per built-in optimizer (adamw, muon, lion, sgd): the same model and batches
through the Trainer's step (eager), tokens/s and the step's cost relative to AdamW's, so an
optimizer's own cost is visible (Muon's Newton-Schulz iterations; target: at most 1.3x AdamW).

    python benchmarks/bench_train.py [--spec specs/tiny.yaml] [--batch 16] [--steps 10] [--rounds 5] [--threads N]
                                     [--no-compile] [--only-optimizers | --no-optimizers]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]


def llama_like(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers LlamaForCausalLM with the shape of our Decoder (GQA, SwiGLU width, tied head)."""
    import transformers

    attention = model.blocks[0].mixer
    config = transformers.LlamaConfig(
        vocab_size=model.vocab_size, hidden_size=model.d_model, intermediate_size=model.blocks[0].ffn.hidden,
        num_hidden_layers=len(model.blocks), num_attention_heads=attention.n_heads,
        num_key_value_heads=attention.n_kv_heads, head_dim=attention.head_dim,
        max_position_embeddings=model.context_length, tie_word_embeddings=model.tie_embeddings,
        rms_norm_eps=model.blocks[0].attention_norm.eps, rope_theta=10000.0, attention_bias=False, mlp_bias=False,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def time_rounds(steps: dict[str, Callable[[], None]], *, n: int, rounds: int) -> dict[str, float]:
    """Median seconds per step of each function, rounds interleaved."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    for fn in steps.values():  # warm-up (and compilation)
        for _ in range(3):
            fn()
    for _ in range(rounds):
        for name, fn in steps.items():
            _sync()
            start = time.perf_counter()
            for _ in range(n):
                fn()
            _sync()
            times[name].append((time.perf_counter() - start) / n)
    return {name: statistics.median(values) for name, values in times.items()}


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default=str(REPO / "specs" / "tiny.yaml"))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10, help="steps per timed round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile variant")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="CPU threads for both (default: PyTorch's, one per physical core)")
    parser.add_argument("--no-optimizers", action="store_true", help="skip the rows per optimizer")
    parser.add_argument("--only-optimizers", action="store_true", help="only the rows per optimizer")
    args = parser.parse_args()

    import specformer
    from specformer_train.config import TrainSpec
    from specformer_train.data import PackedRows
    from specformer.tokenizers.tokenizer import ByteTokenizer
    from specformer_train.trainer import Trainer

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    precision = "bf16" if device.type == "cuda" else "fp32"
    spec = specformer.load_spec(args.spec)
    T = spec.model.context_length
    tokens = np.random.default_rng(0).integers(0, spec.model.vocab_size, size=400_000).astype(np.uint16)

    def ours(compile_: bool, optimizer: str = "adamw") -> tuple[Trainer, Callable[[], None]]:
        config = TrainSpec(batch_size=args.batch, steps=10**6, warmup_steps=0, compile=compile_, device=str(device),
                             progress=False, tensorboard=False, plot=False, precision=precision, threads=args.threads,
                             optimizer=optimizer)
        trainer = Trainer(model=specformer.build(spec, seed=0), config=config,
                          train_rows=PackedRows(tokens, seq_len=T, seed=0), val_rows=None,
                          tokenizer=ByteTokenizer(), out_dir="unused", device=device)

        def step() -> None:
            trainer._train_step(1e-3)
            trainer.state.sequences += trainer.global_batch

        return trainer, step

    if not args.only_optimizers:
        compare_with_transformers(args, ours, tokens, T=T, device=device, precision=precision)
    if not args.no_optimizers:
        compare_optimizers(args, ours, T=T)
    return 0


def compare_optimizers(args: argparse.Namespace, ours: Callable, *, T: int) -> None:
    """Tokens/s of the Trainer's eager step with each built-in optimizer, and its cost against AdamW's."""
    steps = {name: ours(False, name)[1] for name in ("adamw", "muon", "lion", "sgd")}
    seconds = time_rounds(steps, n=args.steps, rounds=args.rounds)
    tokens_per_step = args.batch * T
    print(f"\n  {'optimizer':<22}{'tokens/s':>12}{'step vs adamw':>16}")
    for name, s in seconds.items():
        print(f"  {name:<22}{tokens_per_step / s:>12,.0f}{s / seconds['adamw']:>15.2f}x")
    print("\n  the same model, batches, clipping and loop; only the optimizer differs (target for muon: <= 1.3x)")


def compare_with_transformers(args: argparse.Namespace, ours: Callable, tokens: np.ndarray, *, T: int,
                              device: torch.device, precision: str) -> None:
    from specformer_train.config import TrainSpec
    from specformer_train.data import PackedRows
    from specformer_train.optim import make_optimizer
    from specformer_train.progress import mfu, peak_flops

    eager_trainer, eager_step = ours(False)
    hf = llama_like(eager_trainer.model).to(device)
    hf_optimizer = make_optimizer(hf, TrainSpec(), device=device)
    rows = PackedRows(tokens, seq_len=T, seed=1)
    position = [0]

    def hf_step() -> None:
        batch = torch.from_numpy(rows.rows(position[0], args.batch)).to(device)
        position[0] += args.batch
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = hf(input_ids=batch[:, :-1]).logits
            loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)
        hf_optimizer.step()
        hf_optimizer.zero_grad(set_to_none=True)

    n_ours = sum(p.numel() for p in eager_trainer.model.parameters())
    n_hf = sum(p.numel() for p in hf.parameters())
    print(f"{args.spec}: {n_ours:,} parameters (transformers LlamaForCausalLM: {n_hf:,}); batch {args.batch} x {T} "
          f"tokens; {device}, {precision}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    if n_ours != n_hf:
        print("warning: parameter counts differ; the comparison is not like for like", file=sys.stderr)

    steps = {"specformer eager": eager_step, "transformers Llama": hf_step}
    if not args.no_compile:
        compiled_trainer, compiled_step = ours(True)
        steps["specformer compiled"] = compiled_step
    seconds = time_rounds(steps, n=args.steps, rounds=args.rounds)
    tokens_per_step = args.batch * T
    peer = tokens_per_step / seconds["transformers Llama"]
    peak = peak_flops(device, precision=precision)
    print(f"\n  {'':<22}{'tokens/s':>12}{'vs transformers':>18}" + ("      MFU" if peak else ""))
    for name, s in seconds.items():
        rate = tokens_per_step / s
        line = f"  {name:<22}{rate:>12,.0f}{rate / peer:>17.2f}x"
        if peak:
            line += f"{100 * mfu(rate, flops_per_token=eager_trainer.flops_per_token, peak=peak):>8.1f}%"
        print(line)
    print("\n  target: >= 1.2x; MFU from 6N + 12*L*H*hd*T FLOPs per token" + ("" if peak else " (shown on CUDA only)"))


if __name__ == "__main__":
    sys.exit(main())
