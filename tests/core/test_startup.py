"""Commands that only describe (help, components, schema) start without importing torch.

Checked by ``sys.modules`` in a fresh interpreter, not by timing: importing torch is
most of a command's start-up (benchmarks/bench_startup.py measures the seconds).
"""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = r"""
import contextlib, io, json, sys
from specformer.cli.main import main, make_parser

argvs = [["--help"], ["components"], ["components", "--json"], ["schema"], ["plugins"]]
argvs += [[name, "--help"] for name in sorted(make_parser()[1].by_name)]
for argv in argvs:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(argv)
        except SystemExit:
            pass
    if "torch" in sys.modules:
        print(json.dumps({"imported_torch": argv, "checked": len(argvs)}))
        break
else:
    print(json.dumps({"imported_torch": None, "checked": len(argvs)}))
"""


def test_help_components_schema_and_every_subcommands_help_import_no_torch():
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["checked"] > 20  # every subcommand's --help was tried
    assert report["imported_torch"] is None, f"`specformer {' '.join(report['imported_torch'])}` imported torch"


def test_the_probe_sees_an_import_of_torch():
    # The check above can fail: a command that does import torch is caught.
    code = PROBE.replace('argvs = [["--help"]', 'import torch\nargvs = [["--help"]')
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(result.stdout.strip().splitlines()[-1])["imported_torch"] == ["--help"]
