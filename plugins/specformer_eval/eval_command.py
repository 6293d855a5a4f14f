"""``specformer eval CHECKPOINT --data PATH | --tasks NAMES``: measure a saved model.

Its flags: :mod:`specformer_eval.cli`.

``--data``: loss, perplexity and bits per byte over text read like ``specformer train
--data`` reads it (a file, a folder or a glob of text, or one tokenized ``.bin``/``.npy``),
with the checkpoint's own tokenizer. ``--tasks``: lm-evaluation-harness tasks through the
``specformer`` lm_eval model (the ``eval`` extra). The figures go to stdout (one JSON
object with ``--json``), progress bars to stderr.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from typing import Any

import torch
from tqdm.auto import tqdm

from specformer.checkpoint.save_load import read_metadata
from specformer.errors import UserError
from specformer.machine.threads import auto_threads
from specformer.tokenizers.choice import checkpoint_tokenizer
from specformer.checkpoint.locate import resolve_checkpoint
from specformer_text import find_corpus, load_tokenized

from specformer_eval.loading import load_model
from specformer_eval.perplexity import EvalResult, evaluate_documents, evaluate_tokens


def run(args: argparse.Namespace) -> int:
    if args.data is None and args.tasks is None:
        raise UserError("give --data PATH (text to measure perplexity on), --tasks NAMES (lm-evaluation-harness "
                        "tasks), or both")
    for flag, value in (("--context", args.context), ("--stride", args.stride), ("--batch-size", args.batch_size),
                        ("--limit", args.limit)):
        if value is not None and value <= 0:
            raise UserError(f"{flag} must be positive, got {value:g}")
    if args.num_fewshot is not None and args.num_fewshot < 0:
        raise UserError(f"--num-fewshot must be 0 or more, got {args.num_fewshot}")
    args.checkpoint = str(resolve_checkpoint(args.checkpoint))  # a step-N or run directory: its checkpoint file
    corpus = find_corpus(args.data) if args.data is not None else None  # bad data is reported before the model loads
    tasks = _task_names(args.tasks) if args.tasks is not None else None
    harness = _harness() if tasks else None
    model = load_model(args.checkpoint, device=args.device)
    tokenizer = checkpoint_tokenizer(read_metadata(args.checkpoint), vocab_size=model.vocab_size,
                                     where=args.checkpoint, override=args.tokenizer)
    if next(model.parameters()).device.type == "cpu":
        torch.set_num_threads(auto_threads())

    report: dict[str, Any] = {"checkpoint": args.checkpoint}
    if corpus is not None:
        result = _perplexity(args, model, tokenizer, corpus)
        report.update({"data": corpus.description, **result.to_dict()})
        if not args.json:
            print(format_result(result, checkpoint=args.checkpoint, data=corpus.description))
    if tasks:
        lm = harness.SpecformerLM(model=model, tokenizer=tokenizer, batch_size=args.batch_size or 8)
        limit = int(args.limit) if args.limit is not None and args.limit >= 1 else args.limit
        results = harness.run_tasks(lm, tasks, include_path=args.include_path, num_fewshot=args.num_fewshot,
                                    limit=limit)
        report["tasks"] = results.get("results", {})
        if not args.json:
            from lm_eval.utils import make_table  # late: lm-evaluation-harness is an optional extra

            print(make_table(results))
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    return 0


def _perplexity(args: argparse.Namespace, model: Any, tokenizer: Any, corpus: Any) -> EvalResult:
    context = args.context if args.context is not None else model.context_length
    if context > model.context_length:
        _check_past_context(model, context)
    if args.stride is not None and args.stride > context:
        raise UserError(f"--stride {args.stride} is larger than the context ({context}); use --stride {context} or less")
    settings: dict[str, Any] = dict(context=context, stride=args.stride, batch_size=args.batch_size)
    if corpus.tokenized is not None:
        tokens = load_tokenized(corpus.tokenized, vocab_size=model.vocab_size)
        with _bar(len(tokens) - 1, unit="tok") as bar:
            return evaluate_tokens(model, tokens, on_progress=bar.update, **settings)
    with _bar(corpus.total_bytes, unit="B") as bar:
        result = evaluate_documents(model, tokenizer, corpus.documents(), on_progress=bar.update, **settings)
        bar.update(bar.total - bar.n)  # jsonl files hold more bytes than their text
    return result


def _check_past_context(model: Any, context: int) -> None:
    """``--context`` past the model's context length: as the forward allows it (Decoder.past_context), said once here."""
    verdict, scheme = model.past_context()
    length = model.context_length
    if verdict == "no":
        raise UserError(f"--context {context} is longer than the model's context length {length} (its "
                        f"{type(scheme).__name__} has no position past it); use --context {length} or less")
    if verdict == "warn":
        print(f"note: --context {context} is past the model's context length of {length}: its positions "
              f"({type(scheme).__name__}) were never trained there, so the loss may be higher", file=sys.stderr)
        model._warned_past_context = True  # the forward's own warning would say the same again


def _task_names(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise UserError(f"--tasks {text!r} names no task; give comma-separated names such as hellaswag,arc_easy")
    return names


def _harness() -> Any:
    if importlib.util.find_spec("lm_eval") is None:
        raise UserError("--tasks needs lm-evaluation-harness, which is not installed; "
                        "install it with: pip install 'specformer[eval]'")
    from specformer_eval import harness  # late: imports lm_eval, an optional extra checked just above

    return harness


def format_result(result: EvalResult, *, checkpoint: str, data: str) -> str:
    bpb = "n/a (tokenized input has no text)" if result.bits_per_byte is None else f"{result.bits_per_byte:.4f}"
    return "\n".join([
        f"{checkpoint} on {data}",
        f"  scored         {result.tokens:,} tokens of {result.documents:,} document(s) in {result.windows:,} windows "
        f"(context {result.context}, stride {result.stride})",
        f"  loss           {result.loss:.4f} nats/token",
        f"  perplexity     {result.perplexity:.4f}",
        f"  bits per byte  {bpb}",
        f"  speed          {result.tokens_per_second:,.0f} tokens/s ({result.seconds:.2f} s)",
    ])


def _bar(total: int, *, unit: str) -> Any:
    # Drawn on a terminal only (disable=None), on stderr, so --json output stays clean.
    return tqdm(total=total, unit=unit, unit_scale=True, desc="eval", disable=None, file=sys.stderr,
                dynamic_ncols=True, leave=False)
