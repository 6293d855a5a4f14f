"""``specformer merge RUN_CKPT -o OUT.safetensors``: fold an adapter into its base, as a plain checkpoint.

The adapter is loaded onto its base in float (whatever precision it trained the base
in), each adapted layer becomes ``W + B @ A * alpha / rank``, and the result is written
atomically with the base's tokenizer and Hugging Face entries, so ``generate``, ``eval``
and ``hf export`` treat it like any checkpoint. The output follows :mod:`specformer.files.outputs`:
an existing file is replaced only with ``--force``, and neither the adapter checkpoint nor
its base ever is.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specformer.errors import UserError
from specformer.files.outputs import check_file_output, writing
from specformer.checkpoint.locate import resolve_checkpoint


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", metavar="RUN_CKPT",
                        help="an adapter checkpoint (a fine-tuning run's model.safetensors or a step's, or the run's "
                             "checkpoints/step-N directory, or the run directory: its latest checkpoint)")
    parser.add_argument("-o", "--output", required=True, metavar="OUT.safetensors", help="where to write the merged model")
    parser.add_argument("--force", action="store_true", help="replace OUT.safetensors if it exists (never the adapter "
                        "checkpoint or its base: those are refused even with --force)")


def run(args: argparse.Namespace) -> int:
    # late: these import torch; `specformer merge --help` must not
    import specformer
    from specformer.checkpoint.save_load import read_metadata
    from specformer.checkpoint.check import check_checkpoint
    from specformer_finetune.adapter_file import COPIED_KEYS, base_path, load_adapted, read_record
    from specformer_finetune.apply import merge_adapter

    args.checkpoint = str(resolve_checkpoint(args.checkpoint))  # a step-N or run directory: its checkpoint file
    out = Path(args.output)
    if out.suffix != ".safetensors":
        raise UserError(f"{out}: the output must be a .safetensors file")
    check_file_output(out, inputs=[args.checkpoint], force=args.force)
    metadata = read_metadata(args.checkpoint)
    record = read_record(metadata, args.checkpoint)
    if record is None:
        raise UserError(f"{args.checkpoint}: not an adapter checkpoint (no 'adapter' entry in its header); "
                        "a plain checkpoint needs no merging")
    inputs = [args.checkpoint, base_path(record, args.checkpoint)]  # the base is read too
    check_file_output(out, inputs=inputs, force=args.force)
    model = load_adapted(check_checkpoint(args.checkpoint), "cpu", quantize_base=False)
    targets = len(model.adapter.targets)
    merge_adapter(model)
    kept = {k: v for k, v in metadata.items() if k in COPIED_KEYS}
    check_file_output(out, inputs=inputs, force=args.force)  # again, just before writing
    with writing(out):
        specformer.save(model, out, metadata=kept)
    print(f"{args.checkpoint} -> {out}: {targets} adapted layers merged into the base", file=sys.stderr)
    return 0
