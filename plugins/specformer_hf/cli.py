"""``specformer hf import DIR OUT.safetensors`` | ``specformer hf export CHECKPOINT DIR`` | ``specformer hf families``."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

from specformer.errors import UserError

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

    p = actions.add_parser("export", help="Write a specformer checkpoint as a Hugging Face model directory.",
                           description="Write config.json and model.safetensors (and tokenizer.json when the checkpoint "
                           "stores a BPE tokenizer) that transformers' AutoModelForCausalLM.from_pretrained(DIR) loads.")
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="a .safetensors checkpoint written by specformer")
    p.add_argument("directory", metavar="DIR", help="the directory to write (created if needed)")
    p.add_argument("--family", help="export as this family (model_type, e.g. llama); default: the first that fits")

    actions.add_parser("families", help="List the Hugging Face families import and export understand.")


def run(args: argparse.Namespace) -> int:
    if args.hf_action == "import":
        return _run_import(args)
    if args.hf_action == "export":
        return _run_export(args)
    return _run_families()


def _run_import(args: argparse.Namespace) -> int:
    import torch
    import yaml

    import specformer
    from specformer_hf.importer import import_hf

    out = Path(args.output)
    if out.suffix != ".safetensors":
        raise UserError(f"{out}: the output must be a .safetensors file")
    dtype = getattr(torch, args.dtype) if args.dtype else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        imported = import_hf(args.directory, dtype=dtype)
    for warning in caught:
        print(f"warning: {warning.message}", file=sys.stderr)
    specformer.save(imported.model, out, metadata=imported.metadata())
    spec_path = Path(args.spec_out) if args.spec_out else out.with_suffix(".yaml")
    header = (f"# Imported by `specformer hf import` from {args.directory} "
              f"(Hugging Face {imported.family.name}, model_type {imported.family.model_type}).\n")
    spec_path.write_text(header + yaml.safe_dump(imported.spec, sort_keys=False, default_flow_style=None, width=110), encoding="utf-8")
    n_params = imported.model.num_parameters()
    tokenizer = "with its tokenizer" if imported.tokenizer is not None else "no tokenizer"
    print(f"{args.directory}: {imported.family.name}, {n_params:,} parameters, {tokenizer} -> {out} (spec: {spec_path})")
    return 0


def _run_export(args: argparse.Namespace) -> int:
    import specformer
    from specformer.checkpoint import read_metadata
    from specformer.tokenizer import METADATA_KEY, tokenizer_from_metadata
    from specformer_hf.exporter import to_hf
    from specformer_hf.importer import CONFIG_KEY, FAMILY_KEY

    metadata = read_metadata(args.checkpoint)
    model = specformer.load(args.checkpoint)
    base: dict[str, Any] | None = None
    if CONFIG_KEY in metadata:
        try:
            base = json.loads(metadata[CONFIG_KEY])
        except json.JSONDecodeError:
            base = None  # only token ids come from it; a damaged copy is not worth failing over
    tokenizer = tokenizer_from_metadata(metadata) if METADATA_KEY in metadata else None
    out = to_hf(model, args.directory, family=args.family, prefer=metadata.get(FAMILY_KEY), base_config=base,
                tokenizer=tokenizer)
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    wrote = "config.json, model.safetensors" + (", tokenizer.json" if (out / "tokenizer.json").exists() and tokenizer else "")
    print(f"{args.checkpoint} -> {out} as Hugging Face {config['architectures'][0]} ({wrote})")
    return 0


def _run_families() -> int:
    from specformer_hf.family import get_families

    for family in get_families():
        print(f"{family.model_type:<12} {family.name:<10} {family.architecture:<24} [{family.plugin}]")
        if family.maps:
            print(f"{'':<12} maps: {family.maps}")
        if family.caveats:
            print(f"{'':<12} caveats: {family.caveats}")
    return 0
