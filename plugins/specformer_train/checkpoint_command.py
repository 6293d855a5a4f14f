"""``specformer checkpoint consolidate CKPT_DIR [--out FILE]``: a sharded training checkpoint as one file.

The file is what ``specformer.load`` and ``specformer generate`` read: the weights with
the spec and the tokenizer in the header, as a full checkpoint's ``model.safetensors``.
One process, no ``torch.distributed``: the shards are read from disk and each tensor is
assembled on the CPU.
"""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "Work with training checkpoints: consolidate a sharded one into a single model file."

EPILOG = """\
examples:
  specformer train specs/tiny.yaml --steps 2 --set train.checkpoint_format=sharded    # shard-rank*.safetensors
  specformer checkpoint consolidate runs/tiny/checkpoints/step-0000002    # writes .../step-0000002/model.safetensors
  specformer checkpoint consolidate runs/tiny/checkpoints/step-0000002 --out tiny-step2.safetensors
  specformer generate tiny-step2.safetensors --prompt "def " --max-new-tokens 20
"""


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="checkpoint_action", metavar="ACTION", required=True)
    p = actions.add_parser("consolidate", help="Write a sharded checkpoint (train.checkpoint_format sharded) as one "
                                               "model.safetensors file.",
                           description="Read the shard files of a sharded training checkpoint and write the model's "
                                       "weights as one file, with the spec and tokenizer in its header.",
                           epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("directory", metavar="CKPT_DIR", help="a sharded checkpoint directory (checkpoints/step-N), or a run directory (its latest checkpoint)")
    p.add_argument("--out", metavar="FILE", help="where to write (default: CKPT_DIR/model.safetensors)")
    p.add_argument("--force", action="store_true", help="replace FILE if it exists")


def run(args: argparse.Namespace) -> int:
    # late: the shards' reader imports torch; `specformer --help` must not
    from specformer.checkpoint.locate import checkpoint_directory
    from specformer.errors import UserError
    from specformer.files.outputs import check_file_output, writing

    from specformer_train.sharded_checkpoint import INDEX, consolidate, is_sharded, read_consolidable

    directory = checkpoint_directory(args.directory)  # a run directory: its latest checkpoint
    if not directory.is_dir():
        raise UserError(f"{directory}: not a directory; give a sharded checkpoint directory (checkpoints/step-N)")
    if not is_sharded(directory):
        if (directory / "model.safetensors").is_file():
            raise UserError(f"{directory}: a full checkpoint already; its model.safetensors is the single file")
        raise UserError(f"{directory}: not a sharded checkpoint (no {INDEX}); give a checkpoints/step-N directory "
                        "saved with train.checkpoint_format sharded")
    out = Path(args.out) if args.out else directory / "model.safetensors"
    # every file is checked before anything is written; DamagedCheckpoint (a UserError) names a bad one
    index = read_consolidable(directory)
    # the inputs are the files read, not every file beside them: an earlier default output is replaced with --force
    check_file_output(out, inputs=[directory / INDEX, *index.files], force=args.force)
    with writing(out):  # written whole or not at all
        consolidate(directory, out, index=index)
    print(f"wrote {out}")
    return 0
