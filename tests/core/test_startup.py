"""Commands that only describe (help, components, schema) or check (validate) start without importing torch.

Checked by ``sys.modules`` in a fresh interpreter, not by timing: importing torch is
most of a command's start-up (benchmarks/bench_startup.py measures the seconds).
``validate`` checks sizes through each component's declared check, never by building
(specformer.spec.size_check): every example spec, and bad specs whose problems are found
at each step (structure, kinds, params, sizes), are validated without torch.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import yaml

from conftest import TINY

ROOT = Path(__file__).resolve().parents[2]

PROBE = r"""
import contextlib, io, json, sys
from specformer.cli.main import main, make_parser

argvs = [["--help"], ["components"], ["components", "--json"], ["schema"], ["plugins"]]
argvs += [[name, "--help"] for name in sorted(make_parser()[1].by_name)]
argvs += json.loads(sys.argv[1]) if len(sys.argv) > 1 else []
codes = []
for argv in argvs:
    out = io.StringIO()
    code = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    codes.append(code)
    if "torch" in sys.modules:
        print(json.dumps({"imported_torch": argv, "checked": len(argvs), "codes": codes}))
        break
else:
    print(json.dumps({"imported_torch": None, "checked": len(argvs), "codes": codes}))
"""


def _probe(*extra: list[str]) -> dict:
    result = subprocess.run([sys.executable, "-c", PROBE, json.dumps(list(extra))], capture_output=True, text=True,
                            check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_help_components_schema_and_every_subcommands_help_import_no_torch():
    report = _probe()
    assert report["checked"] > 20  # every subcommand's --help was tried
    assert report["imported_torch"] is None, f"`specformer {' '.join(report['imported_torch'])}` imported torch"


#: Mistakes found by each step of validation, the size check above all (the one that used to build on meta).
BAD_BLOCKS = {
    "heads do not split d_model": {"mixer": {"kind": "attention", "n_heads": 5}},
    "a rope too narrow to turn": {"mixer": {"kind": "attention", "n_heads": 4, "head_dim": 1}},
    "recurrent heads do not split d_model": {"mixer": {"kind": "gated_deltanet", "n_heads": 5}},
    "kda heads do not split d_model": {"mixer": {"kind": "kda", "n_heads": 5}},
    "two caches in one parallel mixer": {"mixer": {"kind": "parallel", "mixers": [
        {"kind": "attention", "n_heads": 2}, {"kind": "attention", "n_heads": 4}]}},
    "router groups that do not split the experts": {"ffn": {"kind": "moe", "n_experts": 6, "top_k": 2, "hidden": 8,
                                                            "router": {"kind": "sigmoid_topk", "n_group": 4}}},
    "postnorm on several residual streams": {"layout": "postnorm", "residual": {"kind": "mhc", "n_streams": 2}},
    "an unknown kind": {"norm": "rmsnrom"},
    "an unknown field": {"ffn": {"kind": "swiglu", "hiden": 8}},
}


#: Blocks no example spec has: validated (exit 0) with the example specs.
GOOD_BLOCKS = {
    "hyper-connections": {"residual": {"kind": "mhc", "n_streams": 2}, "layout": "sandwich"},
    "hash routing": {"ffn": {"kind": "moe", "n_experts": 4, "top_k": 2, "hidden": 8, "router": {"kind": "hash"}}},
}


def _tiny_with(blocks: dict[str, dict], folder: Path) -> list[str]:
    """One spec file per entry of ``blocks``: the tiny spec with that block changed."""
    paths = []
    for name, block in blocks.items():
        spec = copy.deepcopy(TINY)
        spec["model"]["block"].update(block)
        path = folder / f"{name.replace(' ', '-')}.yaml"
        path.write_text(yaml.safe_dump(spec))
        paths.append(str(path))
    return paths


def test_validate_imports_no_torch_for_every_example_spec_and_every_kind_of_mistake(tmp_path):
    specs = sorted(str(p) for p in (ROOT / "specs").glob("*.*")) + _tiny_with(GOOD_BLOCKS, tmp_path)
    bad = sorted(str(p) for p in (ROOT / "docs" / "snippets").glob("*.yaml")) + _tiny_with(BAD_BLOCKS, tmp_path)
    rope = copy.deepcopy(TINY)
    rope["model"]["layers"] = [{"select": 0, "positional": {"kind": "learned"}}]  # a layer-level embedding scheme
    (tmp_path / "layer-positional.yaml").write_text(yaml.safe_dump(rope))
    bad.append(str(tmp_path / "layer-positional.yaml"))
    report = _probe(["validate", *specs], *(["validate", path] for path in bad))
    assert report["imported_torch"] is None, f"`specformer {' '.join(report['imported_torch'])}` imported torch"
    validated = report["codes"][-(len(bad) + 1):]
    assert validated == [0] + [2] * len(bad), dict(zip(["specs/*", *bad], validated))


def test_the_probe_sees_an_import_of_torch():
    # The check above can fail: a command that does import torch is caught.
    code = PROBE.replace('argvs = [["--help"]', 'import torch\nargvs = [["--help"]')
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(result.stdout.strip().splitlines()[-1])["imported_torch"] == ["--help"]
