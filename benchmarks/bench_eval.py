"""Evaluation throughput against training throughput on the demo model (specs/tiny.yaml).

``specformer eval`` should score at least as many tokens per second as training
processes: it is forward-only, batched and streamed. Both run on the same model in the
same process, rounds alternating so other load on the machine hits both alike:

* eval: :func:`specformer_eval.evaluate_documents` over the first ``--eval-bytes`` of the
  demo's corpus (the Python standard library's source), byte tokens, disjoint windows of
  the full context, the default batch (about 8192 tokens) - the whole path a user runs,
  tokenizing and windowing included;
* train: forward, backward and AdamW on the demo's batch (``train.batch_size`` rows of
  the context length), as the Trainer steps.

Printed: tokens/s of each (median round) and eval/train.

    python benchmarks/bench_eval.py [--spec specs/tiny.yaml] [--eval-bytes 65536] [--rounds 3] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from pairwise import sync, train_step  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default=str(REPO / "specs" / "tiny.yaml"))
    parser.add_argument("--eval-bytes", type=int, default=65536, help="bytes of text scored per eval round")
    parser.add_argument("--train-steps", type=int, default=4, help="training steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="CPU threads for both (default: PyTorch's, one per physical core)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import specformer
    from specformer.spec import load_spec
    from specformer.tokenizers.tokenizer import ByteTokenizer
    from specformer_eval import evaluate_documents
    from specformer_train.config import TrainSpec
    from specformer_text.corpus import default_corpus

    spec = load_spec(args.spec)
    config = spec.section("train") or TrainSpec()
    model = specformer.build(spec, seed=0).to(args.device)
    tokenizer = ByteTokenizer()
    documents = _documents(default_corpus().documents(), limit=args.eval_bytes)
    context = model.context_length
    batch = config.batch_size
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, model.vocab_size, (batch, context), generator=g).to(args.device)
    y = torch.randint(0, model.vocab_size, (batch, context), generator=g).to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def eval_round() -> float:
        result = evaluate_documents(model, tokenizer, documents)
        return result.tokens / result.seconds

    def train_round() -> float:
        model.train()
        sync(args.device)
        start = time.perf_counter()
        for _ in range(args.train_steps):
            train_step(model, opt, x, y)
        sync(args.device)
        return args.train_steps * batch * context / (time.perf_counter() - start)

    eval_round(), train_round()  # warm-up
    evals, trains = [], []
    for _ in range(args.rounds):
        evals.append(eval_round())
        trains.append(train_round())
    ev, tr = statistics.median(evals), statistics.median(trains)
    print(f"{args.spec}: {model.num_parameters() / 1e6:.2f}M parameters, context {context}, device {args.device}, "
          f"{args.threads} thread(s)")
    print(f"  eval   {ev:12,.0f} tokens/s  ({sum(len(d.encode()) for d in documents):,} bytes per round, "
          f"default batch)")
    print(f"  train  {tr:12,.0f} tokens/s  (batch {batch} x {context}, forward + backward + AdamW)")
    print(f"  eval / train = {ev / tr:.2f}")
    return 0


def _documents(texts, *, limit: int) -> list[str]:
    """Whole documents from ``texts`` until ``limit`` bytes (the last one cut to fit)."""
    out, total = [], 0
    for text in texts:
        data = text.encode("utf-8")[: limit - total].decode("utf-8", errors="ignore")
        out.append(data)
        total += len(data.encode("utf-8"))
        if total >= limit:
            break
    return out


if __name__ == "__main__":
    sys.exit(main())
