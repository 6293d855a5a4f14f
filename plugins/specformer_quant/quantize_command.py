"""``specformer quantize CKPT --method int8 -o OUT.safetensors``: a quantized copy of a checkpoint.

Its flags: :mod:`specformer_quant.cli`.

The output is one safetensors file like any checkpoint (spec, tokenizer and plugin
sources in the header) plus the recipe; ``specformer.load``, ``generate``, ``eval`` and
``summary`` read it. Every check runs before anything is written, and the output follows
:mod:`specformer.files.outputs`: an existing file is replaced only with ``--force``, the input
checkpoint never (even with it), and the file is written atomically.
"""

from __future__ import annotations

import argparse
import sys

import specformer
from specformer.checkpoint.save_load import read_metadata
from specformer.errors import SpecError, UserError
from specformer.files.outputs import check_file_output, writing
from specformer.tokenizers.tokenizer import METADATA_KEY as TOKENIZER_KEY
from specformer.checkpoint.locate import resolve_checkpoint
from specformer_quant.apply import RECIPE_KEY, quantize, recipe_json, scheme_from, weight_bytes


def method_ref(method: str, group_size: int | None) -> dict:
    ref: dict = {"kind": method}
    if group_size is not None:
        ref["group_size"] = group_size
    try:
        scheme_from(ref, path="--method")
    except SpecError as exc:
        raise UserError(f"--method {method}" + (f" --group-size {group_size}" if group_size is not None else "")
                        + f": {exc}") from None
    return ref


def _head_choice(args: argparse.Namespace) -> bool | None:
    """quantize()'s ``quantize_lm_head``: None (the default: an untied head quantized, a tied one kept float)."""
    if args.keep_lm_head_float:
        return False
    return True if args.quantize_lm_head or args.lm_head_method is not None else None


def run(args: argparse.Namespace) -> int:
    ref = method_ref(args.method, args.group_size)
    head_ref = None
    if args.keep_lm_head_float and args.lm_head_method is not None:
        raise UserError("--keep-lm-head-float keeps the LM head in float; --lm-head-method quantizes it: give one")
    if args.lm_head_method is not None:
        try:
            scheme_from(args.lm_head_method, path="--lm-head-method")
        except SpecError as exc:
            raise UserError(f"--lm-head-method {args.lm_head_method}: {exc}") from None
        head_ref = args.lm_head_method
    args.checkpoint = str(resolve_checkpoint(args.checkpoint))  # a step-N or run directory: its checkpoint file
    check_file_output(args.output, inputs=[args.checkpoint], force=args.force)  # before the work: a refusal is free
    metadata = read_metadata(args.checkpoint)
    if RECIPE_KEY in metadata:
        raise UserError(f"{args.checkpoint} is already quantized; quantize the float checkpoint it came from")
    model = specformer.load(args.checkpoint).eval()
    before = weight_bytes(model)
    try:
        recipe = quantize(model, ref, quantize_lm_head=_head_choice(args),
                          lm_head_scheme=head_ref)
    except ValueError as exc:  # a layer width the scheme cannot take (int4's group size must divide it)
        raise UserError(f"--method {args.method}: {exc}") from None
    kept = {TOKENIZER_KEY: metadata[TOKENIZER_KEY]} if TOKENIZER_KEY in metadata else {}
    check_file_output(args.output, inputs=[args.checkpoint], force=args.force)  # again: quantizing took a while
    with writing(args.output):
        specformer.save(model, args.output, metadata={**kept, RECIPE_KEY: recipe_json(recipe)})
    after = weight_bytes(model)
    head = f" ({head_ref} LM head)" if head_ref is not None else ""
    print(f"wrote {args.output}: {args.method}{head}, {len(recipe['linears'])} linear layers and "
          f"{len(recipe['stacks'])} expert stacks quantized"
          f"{' (and a copy of the tied LM head)' if recipe.get('tied_head') else ''}; weights {before / 2**20:.1f} MiB -> "
          f"{after / 2**20:.1f} MiB", file=sys.stderr)
    return 0
