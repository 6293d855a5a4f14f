"""``specformer dyt-swap SPEC``: the same model with DyT wherever it had a norm."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml
from specformer.errors import UserError
from specformer.spec import load_spec, read_spec_file


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", metavar="SPEC", help="a spec file (.yaml, .yml, .json, .toml)")
    parser.add_argument("-o", "--output", metavar="FILE", help="write the new spec here (YAML) instead of stdout")
    parser.add_argument("--alpha-init", type=float, default=0.5, help="alpha_init of every DyT (default 0.5)")


def swap_norms(data: dict[str, Any], *, alpha_init: float) -> dict[str, Any]:
    """A copy of a spec's data with the block norm, the final norm and per-layer norms set to DyT."""
    model = dict(data["model"])
    dyt = {"kind": "dyt", "alpha_init": alpha_init}
    model["block"] = {**model["block"], "norm": dict(dyt)}
    if model.get("final_norm") is not None:
        model["final_norm"] = dict(dyt)
    model["layers"] = [
        {**layer, "norm": dict(dyt)} if layer.get("norm") is not None else layer for layer in model.get("layers", [])
    ]
    return {**data, "model": model}


def run(args: argparse.Namespace) -> int:
    if args.alpha_init <= 0:
        raise UserError(f"--alpha-init must be > 0, got {args.alpha_init}")
    load_spec(args.spec)  # a SpecError (a UserError) names every problem of the input
    swapped = swap_norms(read_spec_file(args.spec), alpha_init=args.alpha_init)
    load_spec(swapped)  # the result must validate too, sizes included
    text = yaml.safe_dump(swapped, sort_keys=False)
    if args.output:
        out = Path(args.output)
        if out.suffix not in (".yaml", ".yml"):
            raise UserError(f"--output must end in .yaml or .yml, got {out.name!r}")
        out.write_text(text, encoding="utf-8")
        print(f"wrote {out}", file=sys.stderr)
    else:
        print(text, end="")
    return 0
