"""``specformer hf import DIR OUT.safetensors`` | ``specformer hf export CHECKPOINT DIR`` |
``specformer hf attach-tokenizer CHECKPOINT TOKENIZER.json`` | ``specformer hf families``.

Outputs follow :mod:`specformer.files.outputs`: checked before any weights are read (the folder
exists and can be written, nothing is there already unless ``--force``, no input is
overwritten even with it) and written complete or not at all.

Its flags: :mod:`specformer_hf.cli`.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import yaml

import specformer
from specformer.checkpoint.save_load import read_metadata
from specformer.errors import UserError
from specformer.files.outputs import check_file_output, check_folder_output, same_file, write_text_output, writing
from specformer.tokenizers.choice import checkpoint_tokenizer
from specformer.checkpoint.locate import resolve_checkpoint
from specformer_text import CONFIG_KEY, FAMILY_KEY, GENERATION_CONFIG_KEY, TOKENIZER_CONFIG_KEY, attach_tokenizer

from specformer_hf.exporter import to_hf
from specformer_hf.family import get_families
from specformer_hf.importer import import_hf
from specformer_hf.refusal import NoFamily


def run(args: argparse.Namespace) -> int:
    if args.hf_action == "import":
        return _run_import(args)
    if args.hf_action == "export":
        return _run_export(args)
    if args.hf_action == "attach-tokenizer":
        return _run_attach(args)
    return _run_families()


def _run_import(args: argparse.Namespace) -> int:
    out = Path(args.output)
    if out.suffix != ".safetensors":
        raise UserError(f"{out}: the output must be a .safetensors file")
    inputs = [*_read_files(args.directory), *_read_files(args.tokenizer)]
    if (Path(args.directory) / "adapter_config.json").is_file():
        raise UserError(f"{args.directory} is a PEFT adapter (adapter_config.json), not a model: import it onto its "
                        f"imported base with `specformer peft import {args.directory} {out} --base BASE.safetensors`")
    spec_path = Path(args.spec_out) if args.spec_out else out.with_suffix(".yaml")
    if same_file(spec_path, out):
        raise UserError(f"{spec_path}: the spec and the checkpoint cannot be the same file")
    for target in (out, spec_path):  # before any weights are read
        check_file_output(target, inputs=inputs, force=args.force)
    dtype = getattr(torch, args.dtype) if args.dtype else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        imported = import_hf(args.directory, dtype=dtype, tokenizer=args.tokenizer, eos_token=args.eos_token)
    for warning in caught:
        print(f"warning: {warning.message}", file=sys.stderr)
    check_file_output(out, inputs=inputs, force=args.force)  # again: the import took a while
    with writing(out):
        specformer.save(imported.model, out, metadata=imported.metadata())  # atomic: a temporary file renamed
    header = (f"# Imported by `specformer hf import` from {args.directory} "
              f"(Hugging Face {imported.family.name}, model_type {imported.family.model_type}).\n")
    text = header + yaml.safe_dump(imported.spec, sort_keys=False, default_flow_style=None, width=110)
    write_text_output(spec_path, text, inputs=inputs, force=args.force)
    n_params = imported.model.num_parameters()
    tokenizer = ("no tokenizer" if not imported.has_tokenizer else
                 f"with the tokenizer from {args.tokenizer}" if args.tokenizer else "with its tokenizer")
    print(f"{args.directory}: {imported.family.name}, {n_params:,} parameters, {tokenizer} -> {out} (spec: {spec_path})")
    return 0


def _run_export(args: argparse.Namespace) -> int:
    args.checkpoint = str(resolve_checkpoint(args.checkpoint))  # a step-N or run directory: its checkpoint file
    out = Path(args.directory)
    inputs: list[Any] = [args.checkpoint]
    check_folder_output(out, inputs=inputs, force=args.force)  # before the checkpoint is loaded
    metadata = read_metadata(args.checkpoint)
    if "adapter" in metadata:  # the fine-tuning plugin's: its tensors have no place in a Hugging Face model folder
        raise UserError(f"{args.checkpoint} is an adapter checkpoint: write it as a PEFT folder with `specformer peft "
                        f"export {args.checkpoint} {out}`, or fold it into its base with `specformer merge "
                        f"{args.checkpoint} -o MERGED.safetensors` and export that")
    model = specformer.load(args.checkpoint)
    base = _json_object(metadata.get(CONFIG_KEY))  # only token ids come from it: a damaged copy is not worth failing over
    generation = _json_object(metadata.get(GENERATION_CONFIG_KEY))
    settings = _json_object(metadata.get(TOKENIZER_CONFIG_KEY))
    tokenizer = checkpoint_tokenizer(metadata, vocab_size=model.vocab_size, where=args.checkpoint, ids_only=True)
    try:
        out = to_hf(model, out, family=args.family, prefer=metadata.get(FAMILY_KEY), base_config=base,
                    tokenizer=tokenizer, force=args.force, generation_config=generation, tokenizer_settings=settings,
                    inputs=inputs)
    except NoFamily as exc:
        raise UserError(exc.verbose() if args.verbose else str(exc)) from None
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    wrote = ", ".join(sorted(p.name for p in out.iterdir()))
    print(f"{args.checkpoint} -> {out} as Hugging Face {config['architectures'][0]} ({wrote})")
    return 0


def _read_files(given: str | None) -> list[Path]:
    """What import may read from ``given``: the files of a folder, else the path itself (none if not given)."""
    if given is None:
        return []
    path = Path(given)
    return sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]


def _json_object(text: str | None) -> dict[str, Any] | None:
    """A JSON object stored in the header, or None when absent or damaged (it only carries defaults)."""
    try:
        data = json.loads(text) if text else None
    except (json.JSONDecodeError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _run_attach(args: argparse.Namespace) -> int:
    args.checkpoint = str(resolve_checkpoint(args.checkpoint))  # a step-N or run directory: its checkpoint file
    found = attach_tokenizer(args.checkpoint, args.tokenizer, eos_token=args.eos_token, force=args.force)
    print(f"{args.checkpoint}: now stores the tokenizer from {args.tokenizer} "
          f"({found.vocab_size:,} tokens, end of text {found.eot_token!r} = id {found.eot_id})")
    return 0


def _run_families() -> int:
    for family in get_families():
        print(f"{family.model_type:<12} {family.name:<10} {family.architecture:<24} [{family.plugin}]")
        if family.maps:
            print(f"{'':<12} maps: {family.maps}")
        if family.caveats:
            print(f"{'':<12} caveats: {family.caveats}")
    return 0
