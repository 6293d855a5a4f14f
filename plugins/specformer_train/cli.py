"""``specformer train SPEC [--data PATH] [--out DIR] [--resume [CHECKPOINT] [--new-data] | --overwrite] [--init CKPT] [--steps N] [--set KEY=VALUE ...]``."""

from __future__ import annotations

import argparse
import json
import os
import sys

EPILOG = """\
examples:
  specformer train specs/tiny.yaml                       # the standard library's source, byte tokens
  specformer train specs/tiny.yaml --data notes/ --out runs/notes --steps 500 --set train.lr=3e-4
  specformer train specs/tiny.yaml --resume              # continue from runs/tiny/checkpoints/latest
  specformer train specs/tiny.yaml --overwrite           # start again, replacing the run in runs/tiny
  torchrun --standalone --nproc_per_node=2 -m specformer.cli train specs/tiny.yaml --set train.distributed=ddp
"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument("spec", metavar="SPEC", help="spec file (.yaml, .yml, .json, .toml); its train: section sets the run")
    parser.add_argument("--data", metavar="PATH",
                        help="a file, directory or glob of .txt/.md/.py/.jsonl/.json/.parquet/.arrow, a datasets "
                             "save_to_disk directory, or a tokenized .bin/.npy "
                             "(default: train.data, else the Python standard library's source)")
    parser.add_argument("--text-field", metavar="NAME",
                        help="the field holding each document's text in .jsonl/.json/.parquet/.arrow records and "
                             "datasets directories (same as --set train.text_field=NAME; default text)")
    parser.add_argument("--streaming", action="store_true",
                        help="read and tokenize the corpus lazily while training, without a pre-pass "
                             "(same as --set train.streaming=true)")
    parser.add_argument("--out", metavar="DIR", help="run directory (default: train.out_dir, else runs/<spec name>)")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--resume", nargs="?", const="latest", default=None, metavar="CHECKPOINT",
                       help="continue from the latest intact checkpoint of the run directory, or from this "
                            "step-N directory (on the data the run recorded, unless --data and --new-data say otherwise)")
    start.add_argument("--overwrite", action="store_true",
                       help="start afresh in a run directory that holds an earlier run, deleting its checkpoints")
    parser.add_argument("--new-data", action="store_true",
                        help="with --resume: continue on --data although it differs from the data the run recorded")
    parser.add_argument("--init", metavar="CKPT",
                        help="fine-tune: start from this checkpoint's weights and tokenizer (same as --set train.init=CKPT; "
                             "the spec's model must be the checkpoint's)")
    parser.add_argument("--steps", type=int, metavar="N", help="train for N optimizer steps (same as --set train.steps=N)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a spec value by its dotted key, e.g. --set train.lr=3e-4 (repeatable)")


def run(args: argparse.Namespace) -> int:
    from specformer_train.run import train  # late: imports torch; `specformer train --help` must not

    overrides = list(args.overrides)
    if args.text_field is not None:  # JSON-quoted, so a field named "1" or "true" stays a string
        overrides.append(f"train.text_field={json.dumps(args.text_field)}")
    if args.streaming:
        overrides.append("train.streaming=true")
    try:
        result = train(args.spec, data=args.data, out_dir=args.out, resume=args.resume or False,
                       overwrite=args.overwrite, new_data=args.new_data, overrides=overrides, steps=args.steps,
                       init=args.init)
    except KeyboardInterrupt:
        # Ctrl-C before the training loop took over (or a second one during a save): nothing
        # half-written is left, since every file is written under a temporary name first.
        if _is_main():
            print("interrupted; the run directory keeps its last complete checkpoint, if any", file=sys.stderr)
        return 130
    if not _is_main():
        return 0
    if result.status == "interrupted":
        where = result.checkpoint or "(none)"
        print(f"interrupted at step {result.step}; saved {where}. Continue with --resume.", file=sys.stderr)
        if result.generate_command is not None:
            print(f"try:   {result.generate_command}", file=sys.stderr)
        return 130
    print(f"done: {result.step} steps, train loss {_fmt(result.loss)}, validation loss {_fmt(result.val_loss)}")
    if result.model_path is not None:
        print(f"model: {result.model_path} (metrics.jsonl, loss.png and checkpoints/ beside it)")
        print(f"try:   {result.generate_command}")
    return 0


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _is_main() -> bool:
    return os.environ.get("RANK", "0") == "0"
