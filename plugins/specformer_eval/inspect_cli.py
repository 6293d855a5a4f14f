"""The flags of ``specformer inspect CHECKPOINT --prompt TEXT --out DIR [--token T]``.

Only the parser, built for every ``specformer --help``, so it imports no torch;
:mod:`specformer_eval.inspect_command` runs the command.
"""

from __future__ import annotations

import argparse

EPILOG = """\
example:
  specformer inspect runs/tiny/model.safetensors --prompt "def add(a, b):" --token b --out inspect/
"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument("checkpoint", metavar="CHECKPOINT", help="a .safetensors checkpoint written by specformer, a run's checkpoints/step-N "
                                                                 "directory, or a run directory (its latest checkpoint)")
    parser.add_argument("--prompt", required=True, help="the text to run through the model")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder to write the pictures and index.html to "
                        "(created, with the folders above it)")
    parser.add_argument("--force", action="store_true", help="replace DIR if it already holds files (once the new "
                        "pictures are complete; never a folder holding CHECKPOINT or --tokenizer)")
    parser.add_argument("--token", metavar="T",
                        help="the query token of attention-<token>.png: a position (negative counts from the end) "
                             "or a token's text (its last occurrence); default: the last token")
    parser.add_argument("--top-k", type=int, default=5, metavar="K", help="tokens the logit lens lists per cell (default 5)")
    parser.add_argument("--tokenizer", metavar="FILE", help="a tokenizer.json, for a checkpoint that stores no tokenizer")
    parser.add_argument("--device", default="cpu", help="device to run on: cpu, cuda, cuda:1, mps (default cpu)")

