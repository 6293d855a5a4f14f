"""``specformer peft import PEFT_DIR OUT.safetensors --base BASE.safetensors`` | ``specformer peft export ADAPTER DIR``.

An adapter checkpoint to and from a PEFT LoRA folder (:mod:`.peft_io`), for the base that
``specformer hf import`` wrote or ``specformer hf export`` writes. Outputs follow
:mod:`specformer.files.outputs`: checked before any weights are read, never an input (the
adapter checkpoint, its base, the PEFT folder's files), written complete or not at all.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from specformer.errors import UserError
from specformer.files.outputs import check_file_output, check_folder_output
from specformer.checkpoint.locate import resolve_checkpoint
from specformer_text import FAMILY_KEY


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="peft_action", metavar="ACTION", required=True)
    p = actions.add_parser("import", help="Write a PEFT LoRA folder as an adapter checkpoint on its imported base.",
                           description="Read PEFT_DIR (adapter_config.json, adapter_model.safetensors; plain LoRA) and "
                           "write OUT.safetensors, an adapter checkpoint on BASE (the base model imported with "
                           "`specformer hf import`), which generate, merge and train --resume read.")
    p.add_argument("directory", metavar="PEFT_DIR", help="a folder written by peft's save_pretrained()")
    p.add_argument("output", metavar="OUT.safetensors", help="the adapter checkpoint to write")
    p.add_argument("--base", required=True, metavar="BASE.safetensors", help="the specformer checkpoint of the base "
                   "model the adapter was trained on")
    p.add_argument("--family", help="read the Hugging Face names as this family (model_type, e.g. llama); default: "
                   "the family BASE was imported from, else the first that fits")
    p.add_argument("--force", action="store_true", help="replace OUT.safetensors if it exists (never a file of "
                   "PEFT_DIR or BASE: those are refused even with --force)")

    p = actions.add_parser("export", help="Write an adapter checkpoint as a PEFT LoRA folder.",
                           description="Write adapter_config.json and adapter_model.safetensors to DIR, which "
                           "peft.PeftModel.from_pretrained loads onto the base exported by `specformer hf export`. DIR "
                           "is written whole or not at all; one that already holds files is replaced only with --force.")
    p.add_argument("checkpoint", metavar="ADAPTER", help="an adapter checkpoint (a fine-tuning run's model.safetensors, a step-N "
                                                               "directory, or the run directory: its latest)")
    p.add_argument("directory", metavar="DIR", help="the directory to write (created if needed; its parent must exist)")
    p.add_argument("--family", help="name the layers as this family does (model_type, e.g. llama); default: the "
                   "family the base was imported from, else the first that fits")
    p.add_argument("--force", action="store_true", help="replace DIR if it already holds files (only once the new "
                   "folder is complete; never a folder holding ADAPTER or its base)")


def run(args: argparse.Namespace) -> int:
    if args.peft_action == "import":
        return _run_import(args)
    return _run_export(args)


def _read_files(given: str) -> list[Path]:
    """What import may read from ``given``: the files of a folder, else the path itself."""
    path = Path(given)
    return sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]


def _run_import(args: argparse.Namespace) -> int:
    from specformer_finetune.peft_io import import_peft  # late: imports torch; `specformer peft --help` must not

    out = Path(args.output)
    if out.suffix != ".safetensors":
        raise UserError(f"{out}: the output must be a .safetensors file")
    check_file_output(out, inputs=[*_read_files(args.directory), args.base], force=args.force)
    model = import_peft(args.directory, args.base, out, family=args.family)
    print(f"{args.directory}: PEFT LoRA on {args.base} -> {out} (adapter checkpoint, rank {model.adapter.ref['rank']}, "
          f"{len(model.adapter.targets)} layers)")
    return 0


def _run_export(args: argparse.Namespace) -> int:
    # late: these import torch; `specformer peft --help` must not
    from specformer.checkpoint.save_load import read_metadata
    from specformer.checkpoint.check import check_checkpoint

    from specformer_finetune.adapter_file import load_adapted
    from specformer_finetune.peft_io import export_peft

    args.checkpoint = str(resolve_checkpoint(args.checkpoint))  # a step-N or run directory: its checkpoint file
    out = Path(args.directory)
    inputs: list[Any] = [args.checkpoint]
    check_folder_output(out, inputs=inputs, force=args.force)  # before the checkpoint is loaded
    metadata = read_metadata(args.checkpoint)
    if "adapter" not in metadata:
        raise UserError(f"peft export writes an adapter checkpoint; {args.checkpoint} is a plain checkpoint (export it "
                        "with `specformer hf export`)")
    model = load_adapted(check_checkpoint(args.checkpoint), "cpu", quantize_base=False)
    base = model.adapter.base["path"] if model.adapter.base else None
    if base:  # the base is read too: the folder may not hold it either
        inputs.append(base)
        check_folder_output(out, inputs=inputs, force=args.force)
    export_peft(model, out, family=args.family, prefer=metadata.get(FAMILY_KEY), base_path=base, force=args.force,
                inputs=inputs)
    print(f"{args.checkpoint} -> {out} as a PEFT LoRA adapter (adapter_config.json, adapter_model.safetensors); "
          f"load it with peft.PeftModel.from_pretrained onto the base exported by `specformer hf export`")
    return 0
