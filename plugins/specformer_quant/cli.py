"""The flags of ``specformer quantize CKPT --method SCHEME -o OUT.safetensors``.

Only the parser, built for every ``specformer --help``, so it imports no torch;
:mod:`specformer_quant.quantize_command` runs the command.
"""

from __future__ import annotations

import argparse

def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="a float .safetensors checkpoint written by specformer, a run's checkpoints/step-N "
                                           "directory, or a run directory (its latest checkpoint)")
    parser.add_argument("--method", required=True, metavar="SCHEME",
                        help="a registered quantization scheme: int8, int4, bf16 (see `specformer components`)")
    parser.add_argument("--group-size", type=int, default=None, help="int4 only: 32 (default), 64 or 128")
    head = parser.add_mutually_exclusive_group()
    head.add_argument("--quantize-lm-head", action="store_true",
                      help="quantize a head tied to the embedding too, as a separate copy (an untied LM head is "
                           "quantized by default; embeddings never are)")
    head.add_argument("--keep-lm-head-float", action="store_true",
                      help="keep the LM head in float (default: an untied head is quantized with --method)")
    parser.add_argument("--lm-head-method", default=None, metavar="SCHEME",
                        help="quantize the LM head with this scheme instead of --method (implies --quantize-lm-head; "
                             "e.g. --method int4 --lm-head-method int8)")
    parser.add_argument("-o", "--output", required=True, metavar="OUT.safetensors", help="where to write it")
    parser.add_argument("--force", action="store_true",
                        help="replace OUT.safetensors if it exists (never the input checkpoint: that is refused even "
                             "with --force)")

