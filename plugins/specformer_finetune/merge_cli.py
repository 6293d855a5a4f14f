"""``specformer merge RUN_CKPT -o OUT.safetensors``: fold an adapter into its base, as a plain checkpoint.

The adapter is loaded onto its base in float (whatever precision it trained the base
in), each adapted layer becomes ``W + B @ A * alpha / rank``, and the result is written
atomically with the base's tokenizer and Hugging Face entries, so ``generate``, ``eval``
and ``hf export`` treat it like any checkpoint.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specformer.errors import UserError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", metavar="RUN_CKPT",
                        help="an adapter checkpoint (a fine-tuning run's model.safetensors or a step's)")
    parser.add_argument("-o", "--output", required=True, metavar="OUT.safetensors", help="where to write the merged model")
    parser.add_argument("--force", action="store_true", help="replace OUT.safetensors if it exists")


def run(args: argparse.Namespace) -> int:
    import specformer
    from specformer.checkpoint import read_metadata
    from specformer.checkpoint_check import check_checkpoint
    from specformer_finetune.adapter_file import ADAPTER_KEY, COPIED_KEYS, load_adapted
    from specformer_finetune.apply import merge_adapter

    out = Path(args.output)
    if out.suffix != ".safetensors":
        raise UserError(f"{out}: the output must be a .safetensors file")
    if out.exists() and not args.force:
        raise UserError(f"{out}: already exists; give --force to replace it")
    if out.resolve() == Path(args.checkpoint).resolve():
        raise UserError(f"{out}: is the adapter checkpoint itself; write the merged model elsewhere")
    metadata = read_metadata(args.checkpoint)
    if ADAPTER_KEY not in metadata:
        raise UserError(f"{args.checkpoint}: not an adapter checkpoint (no 'adapter' entry in its header); "
                        "a plain checkpoint needs no merging")
    model = load_adapted(check_checkpoint(args.checkpoint), "cpu", quantize_base=False)
    targets = len(model.adapter.targets)
    merge_adapter(model)
    kept = {k: v for k, v in metadata.items() if k in COPIED_KEYS}
    try:
        specformer.save(model, out, metadata=kept)
    except OSError as exc:
        raise UserError(f"{out}: could not be written ({exc.strerror or exc}); nothing was changed") from None
    print(f"{args.checkpoint} -> {out}: {targets} adapted layers merged into the base", file=sys.stderr)
    return 0
