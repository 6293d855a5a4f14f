"""The cost of document masking in packed training, against transformers' Llama given the same mask.

Rows are cut from a stream of documents whose lengths are drawn uniformly from 8 to
2 x context tokens, each followed by the end-of-text token, so nearly every row holds a
boundary (the case masking changes; a corpus of long documents pays it on few rows, since
a batch without a boundary keeps the plain causal kernel). specformer's Trainer step
(batch fetch, document layout on the host, forward, backward, clipping, AdamW) runs with
``train.document_mask``/``reset_positions`` on and off; the peer is transformers'
LlamaForCausalLM of the same shape given the same documents as a 4-D block-diagonal
causal mask and restarting ``position_ids`` (its way to mask packed documents without
flash-attention), in the same hand-written loop bench_train.py uses. Rounds alternate and
the median counts. Printed: tokens/s of each, ours against the peer, and what masking
costs ours.

    python benchmarks/bench_packed.py [--spec specs/tiny.yaml] [--batch 16] [--steps 10] [--rounds 5] [--threads N]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_train import REPO, llama_like, time_rounds  # noqa: E402


def packed_stream(*, n_tokens: int, context: int, eot: int, vocab: int, seed: int = 0) -> np.ndarray:
    """Documents of 8 to 2 x context random tokens (below ``eot``), each followed by ``eot``."""
    rng = np.random.default_rng(seed)
    parts, total = [], 0
    while total < n_tokens:
        doc = rng.integers(0, min(eot, vocab), size=int(rng.integers(8, 2 * context + 1)))
        parts += [doc, np.array([eot])]
        total += len(doc) + 1
    return np.concatenate(parts).astype(np.uint16)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default=str(REPO / "specs" / "tiny.yaml"))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10, help="steps per timed round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()

    import specformer
    from specformer.tokenizers.tokenizer import ByteTokenizer
    from specformer_train.config import TrainSpec
    from specformer_train.data import PackedRows
    from specformer_train.documents import document_ids, document_positions
    from specformer_train.optim import make_optimizer
    from specformer_train.trainer import Trainer

    torch.set_num_threads(args.threads)
    spec = specformer.load_spec(args.spec)
    T = spec.model.context_length
    eot = ByteTokenizer().eot_id
    tokens = packed_stream(n_tokens=400_000, context=T, eot=eot, vocab=spec.model.vocab_size)

    def ours(masked: bool):
        config = TrainSpec(batch_size=args.batch, steps=10**6, warmup_steps=0, compile=False, device="cpu",
                             progress=False, tensorboard=False, plot=False, precision="fp32", threads=args.threads,
                             document_mask=masked, reset_positions=masked)
        trainer = Trainer(model=specformer.build(spec, seed=0), config=config,
                          train_rows=PackedRows(tokens, seq_len=T, seed=0), val_rows=None,
                          tokenizer=ByteTokenizer(), out_dir="unused", device="cpu")

        def step() -> None:
            trainer._train_step(1e-3)
            trainer.state.sequences += trainer.global_batch

        return trainer, step

    masked_trainer, masked_step = ours(True)
    _, plain_step = ours(False)
    hf = llama_like(masked_trainer.model)
    hf_optimizer = make_optimizer(hf, TrainSpec(), device=torch.device("cpu"))
    rows = PackedRows(tokens, seq_len=T, seed=1)
    position = [0]
    causal = torch.ones(T, T, dtype=torch.bool).tril()

    def hf_step() -> None:
        batch = rows.rows(position[0], args.batch)
        position[0] += args.batch
        inputs = batch[:, :-1]
        ids = torch.from_numpy(document_ids(inputs, eot_id=eot))  # (B, T)
        mask = (causal & (ids[:, :, None] == ids[:, None, :]))[:, None]  # (B, 1, T, T): same document, causal
        positions = torch.from_numpy(document_positions(inputs, eot_id=eot))
        batch_t = torch.from_numpy(batch)
        logits = hf(input_ids=batch_t[:, :-1], attention_mask=mask, position_ids=positions).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), batch_t[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)
        hf_optimizer.step()
        hf_optimizer.zero_grad(set_to_none=True)

    sample = rows.rows(0, 256)[:, :-1]
    boundaries = float((sample[:, 1:] == eot).sum(axis=1).mean())
    print(f"{args.spec}: batch {args.batch} x {T} tokens, {boundaries:.1f} document boundaries per row on average; "
          f"cpu fp32, torch {torch.__version__}, {torch.get_num_threads()} threads")
    steps = {"specformer masked": masked_step, "specformer unmasked": plain_step, "transformers masked": hf_step}
    seconds = time_rounds(steps, n=args.steps, rounds=args.rounds)
    tokens_per_step = args.batch * T
    peer = tokens_per_step / seconds["transformers masked"]
    print(f"\n  {'':<22}{'tokens/s':>12}{'vs transformers masked':>25}")
    for name, s in seconds.items():
        rate = tokens_per_step / s
        print(f"  {name:<22}{rate:>12,.0f}{rate / peer:>24.2f}x")
    cost = seconds["specformer masked"] / seconds["specformer unmasked"]
    print(f"\n  document masking costs specformer {cost:.2f}x the unmasked step on these rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
