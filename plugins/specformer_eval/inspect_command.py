"""``specformer inspect CHECKPOINT --prompt TEXT --out DIR [--token T]``: pictures of one forward pass.

Its flags: :mod:`specformer_eval.inspect_cli`.

Writes ``attention.png`` (every layer's and head's attention), ``attention-<token>.png``
(where the ``--token`` looks, per layer), ``logit-lens.png`` (each layer's prediction) and
``index.html`` (all of it on one self-contained page, exact numbers on hover) into DIR;
for a model whose attention grid is too big for one labelled picture, also
``attention-by-layer/layer-NN.png``, one per layer. DIR is written whole or not at all (:mod:`specformer.files.outputs`): one that already holds
files is replaced only with ``--force``, and never while it holds the checkpoint.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import torch

from specformer.checkpoint.save_load import read_metadata
from specformer.errors import UserError
from specformer.files.outputs import check_folder_output, staged_folder
from specformer.machine.threads import auto_threads
from specformer.tokenizers.choice import checkpoint_tokenizer
from specformer.checkpoint.locate import resolve_checkpoint

from specformer_eval.figures import attention_grid, attention_lines, lens_grid
from specformer_eval.inspection import Inspection, choose_token, inspect_prompt
from specformer_eval.loading import load_model
from specformer_eval.page import write_page


def run(args: argparse.Namespace) -> int:
    if args.top_k < 1:
        raise UserError(f"--top-k must be at least 1, got {args.top_k}")
    args.checkpoint = str(resolve_checkpoint(args.checkpoint))  # a step-N or run directory: its checkpoint file
    out = Path(args.out)
    inputs = [args.checkpoint, args.tokenizer]
    check_folder_output(out, inputs=inputs, force=args.force, parents=True)  # before the model is loaded
    model = load_model(args.checkpoint, device=args.device)
    tokenizer = checkpoint_tokenizer(read_metadata(args.checkpoint), vocab_size=model.vocab_size,
                                     where=args.checkpoint, override=args.tokenizer)
    if next(model.parameters()).device.type == "cpu":
        torch.set_num_threads(auto_threads())
    inspection = inspect_prompt(model, tokenizer, args.prompt, k=args.top_k)
    position = choose_token(inspection, args.token)
    with staged_folder(out, inputs=inputs, force=args.force, parents=True) as stage:
        written = write_inspection(inspection, out=stage, position=position, title=f"{args.checkpoint}: {args.prompt!r}")
    for path in written:
        print(out / path.relative_to(stage))
    return 0


def write_inspection(inspection: Inspection, *, out: Path, position: int, title: str) -> list[Path]:
    """The files of ``specformer inspect`` in ``out``; their paths, index.html last.

    Four files, and one ``attention-by-layer/layer-NN.png`` per layer when the attention of
    every layer and head is too big for one labelled picture.
    """
    grid, *per_layer = attention_grid(inspection, out)
    lines = attention_lines(inspection, position, out / f"attention-{token_slug(inspection, position)}.png")
    lens = lens_grid(inspection, out / "logit-lens.png")
    page = write_page(inspection, path=out / "index.html", title=title, position=position, images={
        "attention: every layer and head": grid,
        f"attention of token {position} {inspection.labels[position]!r}, per layer": lines,
        "logit lens": lens,
    }, layer_images=per_layer)
    return [grid, *per_layer, lines, lens, page]


def token_slug(inspection: Inspection, position: int) -> str:
    """The token's text as a file-name part (letters, digits, '-', '_'), else its position."""
    slug = re.sub(r"[^A-Za-z0-9_-]+", "", inspection.labels[position])[:40]
    return slug or str(position)
