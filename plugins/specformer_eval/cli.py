"""The flags of ``specformer eval CHECKPOINT --data PATH | --tasks NAMES``.

Only the parser, built for every ``specformer --help``, so it imports no torch;
:mod:`specformer_eval.eval_command` runs the command.
"""

from __future__ import annotations

import argparse

EPILOG = """\
examples:
  specformer eval runs/tiny/model.safetensors --data notes/
  specformer eval model.safetensors --data 'books/*.txt' --context 1024 --stride 512 --json
  specformer eval model.safetensors --tasks hellaswag,arc_easy --limit 100      # needs specformer[eval]
  specformer eval model.safetensors --tasks my_task --include-path my_tasks/    # task YAMLs of your own
"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument("checkpoint", metavar="CHECKPOINT", help="a .safetensors checkpoint written by specformer, a run's checkpoints/step-N "
                                                                 "directory, or a run directory (its latest checkpoint)")
    parser.add_argument("--data", metavar="PATH",
                        help="a file, directory or glob of .txt/.md/.py/.jsonl (one document per file, or per "
                             "jsonl line), or one tokenized .bin/.npy")
    parser.add_argument("--context", type=int, metavar="N",
                        help="tokens per window (default: the model's context length)")
    parser.add_argument("--stride", type=int, metavar="S",
                        help="tokens a window moves on; each token is scored with at least N - S tokens before it "
                             "(default: N, disjoint windows)")
    parser.add_argument("--batch-size", type=int, metavar="B", help="windows per forward pass (default: ~8192 tokens)")
    parser.add_argument("--tokenizer", metavar="FILE",
                        help="a tokenizer.json, for a checkpoint that stores no tokenizer")
    parser.add_argument("--device", default="cpu", help="device to run on: cpu, cuda, cuda:1, mps (default cpu)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    harness = parser.add_argument_group("lm-evaluation-harness (pip install 'specformer[eval]')")
    harness.add_argument("--tasks", metavar="NAMES", help="comma-separated lm_eval task names or glob patterns")
    harness.add_argument("--include-path", metavar="DIR", help="a folder of your own lm_eval task YAMLs")
    harness.add_argument("--num-fewshot", type=int, metavar="K", help="few-shot examples per prompt (default: the task's)")
    harness.add_argument("--limit", type=float, metavar="N", help="at most N documents per task (a fraction if < 1)")

