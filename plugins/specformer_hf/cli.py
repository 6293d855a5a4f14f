"""The flags of ``specformer hf import | export | attach-tokenizer | families``.

Only the parser, built for every ``specformer --help``, so it imports no torch;
:mod:`specformer_hf.hf_command` runs the command.
"""

from __future__ import annotations

import argparse

DTYPES = ("float32", "bfloat16", "float16")


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="hf_action", metavar="ACTION", required=True)
    p = actions.add_parser("import", help="Convert a local Hugging Face model directory into a specformer checkpoint.",
                           description="Read DIR (config.json, model.safetensors or shards, tokenizer.json if present; "
                           "never the network) and write OUT.safetensors plus its spec as OUT.yaml.")
    p.add_argument("directory", metavar="DIR", help="a directory saved by transformers' save_pretrained()")
    p.add_argument("output", metavar="OUT.safetensors", help="the specformer checkpoint to write")
    p.add_argument("--dtype", choices=DTYPES, help="convert the weights to this dtype (default: keep the file's)")
    p.add_argument("--spec-out", metavar="SPEC.yaml", help="where to write the spec (default: OUT with .yaml)")
    p.add_argument("--tokenizer", metavar="PATH", help="a tokenizer.json (or a folder holding one) to store instead of "
                   "DIR's own; without either, the checkpoint records that it has no tokenizer")
    p.add_argument("--eos-token", metavar="TOKEN", help="the tokenizer's end-of-text token (default: the config's "
                   "eos_token_id token, else <|endoftext|>)")
    p.add_argument("--force", action="store_true", help="replace OUT.safetensors and the spec file if they exist "
                   "(never a file of DIR or --tokenizer: those are refused even with --force)")

    p = actions.add_parser("export", help="Write a specformer checkpoint as a Hugging Face model directory.",
                           description="Write config.json, model.safetensors and generation_config.json (and "
                           "tokenizer.json with tokenizer_config.json when the checkpoint stores a BPE tokenizer) that "
                           "transformers' AutoModelForCausalLM.from_pretrained(DIR) and pipeline() load. DIR is written "
                           "whole or not at all; one that already holds files is replaced only with --force.")
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="a .safetensors checkpoint written by specformer, a run's checkpoints/step-N "
                                                            "directory, or a run directory (its latest checkpoint)")
    p.add_argument("directory", metavar="DIR", help="the directory to write (created if needed; its parent must exist)")
    p.add_argument("--family", help="export as this family (model_type, e.g. llama); default: the first that fits")
    p.add_argument("--verbose", action="store_true", help="when no family fits, give each family's reason (by default "
                   "one line: the part most families lack, and the closest families)")
    p.add_argument("--force", action="store_true", help="replace DIR if it already holds files (only once the new "
                   "export is complete; never a folder holding CHECKPOINT)")

    p = actions.add_parser("attach-tokenizer", help="Store a tokenizer.json in an existing checkpoint.",
                           description="Store TOKENIZER (a tokenizer.json, or a folder holding one) in CHECKPOINT's "
                           "header, so generate and train read text with it. The checkpoint is rewritten atomically.")
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="a .safetensors checkpoint written by specformer, a run's checkpoints/step-N "
                                                            "directory, or a run directory (its latest checkpoint)")
    p.add_argument("tokenizer", metavar="TOKENIZER", help="a tokenizer.json, or a Hugging Face folder holding one")
    p.add_argument("--eos-token", metavar="TOKEN", help="the end-of-text token (default: the imported config's "
                   "eos_token_id token, else <|endoftext|>)")
    p.add_argument("--force", action="store_true", help="replace a tokenizer the checkpoint already has (the "
                   "checkpoint is rewritten in place, atomically; TOKENIZER may not be the checkpoint itself)")

    actions.add_parser("families", help="List the Hugging Face families import and export understand.")

