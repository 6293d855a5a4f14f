"""The flags of ``specformer export gguf CKPT OUT.gguf [--type f32|f16|bf16|q8_0]``.

Only the parser, built for every ``specformer --help``, so it imports neither torch nor gguf;
:mod:`specformer_gguf.export_command` runs the command.
"""

from __future__ import annotations

import argparse

#: The tensor types --type accepts (kept here, not imported from writer.py, which imports numpy).
TYPES = ("f32", "f16", "bf16", "q8_0")


def configure(parser: argparse.ArgumentParser) -> None:
    formats = parser.add_subparsers(dest="export_format", metavar="FORMAT", required=True)
    p = formats.add_parser("gguf", help="Write a llama-like checkpoint as a GGUF file for llama.cpp.",
                           description="Write CHECKPOINT as one GGUF file (llama.cpp's llama architecture: weights, "
                           "hyperparameters and the tokenizer, so llama.cpp needs nothing else). A spec with a part "
                           "llama.cpp's llama architecture lacks is refused, naming the part.")
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="a .safetensors checkpoint written by specformer, a run's "
                   "checkpoints/step-N directory, or a run directory (its latest checkpoint)")
    p.add_argument("output", metavar="OUT.gguf", help="the GGUF file to write")
    p.add_argument("--type", dest="tensor_type", choices=TYPES, default="f16",
                   help="the matrices' storage type (default f16); norms stay f32 as llama.cpp's converter keeps them")
    p.add_argument("--force", action="store_true", help="replace OUT.gguf if it exists (never the input checkpoint)")
