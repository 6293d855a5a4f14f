"""How long does a command take to start?

Times each command in a fresh interpreter (median of ``--repeats`` runs, interleaved) and
prints it next to the peer every PyTorch command line pays at least once, ``python -c
"import torch"``, measured in the same run, with the ratio ours / import-torch. The
commands that show help, list components, print the schema or validate specs should not
import torch at all (tests/core/test_startup.py asserts that by ``sys.modules``); their
ratio is how much of torch's start-up they save. ``validate`` is timed on one spec and on
every example spec in ``specs/`` at once (each component's declared size check, no model
built). Targets on a quiet 2-core machine: every command that runs no model under 1 s
(``--help`` < 0.5 s), and the ratio well under 1.

Then it says where the start-up of ``specformer --help`` goes: the time to import the core
and each plugin's entry-point module (what registering that plugin costs, the pydantic
``Params`` models it defines included), from one fresh interpreter.

    python benchmarks/bench_startup.py
    python benchmarks/bench_startup.py --repeats 7 --spec specs/tiny.yaml
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--spec", default="specs/tiny.yaml")
    args = parser.parse_args()
    python = sys.executable
    cli = [python, "-m", "specformer.cli"]
    cases = {
        "specformer --help": [*cli, "--help"],
        "specformer train --help": [*cli, "train", "--help"],
        "specformer generate --help": [*cli, "generate", "--help"],
        "specformer components": [*cli, "components"],
        "specformer schema": [*cli, "schema"],
        f"specformer validate {args.spec}": [*cli, "validate", args.spec],
        "specformer validate specs/* (every example)": [*cli, "validate", *sorted(str(p.relative_to(ROOT))
                                                                          for p in (ROOT / "specs").glob("*.*"))],
        f"specformer summary {args.spec}": [*cli, "summary", args.spec],
    }
    peer = [python, "-c", "import torch"]
    times: dict[str, list[float]] = {name: [] for name in cases}
    peer_times: list[float] = []
    for _ in range(args.repeats):  # interleaved, so drift in machine load hits every command alike
        peer_times.append(timed(peer))
        for name, argv in cases.items():
            times[name].append(timed(argv))
    base = statistics.median(peer_times)
    print(f"{'command':44} {'ours s':>8} {'import torch s':>15} {'ratio':>6}")
    for name, measured in times.items():
        ours = statistics.median(measured)
        print(f"{name:44} {ours:8.2f} {base:15.2f} {ours / base:6.2f}")
    print()
    print(f"{'what specformer --help imports':52} {'seconds':>12}")
    for module, seconds in import_times():
        print(f"{module:52} {seconds:12.3f}")


_LOAD_EACH = """
import json, sys, time
from importlib.metadata import entry_points
start = time.perf_counter()
import specformer.cli.main
times = {"specformer (core, the CLI)": time.perf_counter() - start}
for point in sorted(entry_points(group="specformer"), key=lambda p: p.name):
    start = time.perf_counter()
    point.load()
    times[f"{point.value} (plugin {point.name!r})"] = time.perf_counter() - start
print(json.dumps(times))
"""


def import_times() -> list[tuple[str, float]]:
    """The core's import and each plugin's entry-point import, in discovery's order, in one fresh interpreter.

    ``python -X importtime`` does not see these: discovery imports plugins through
    ``importlib`` (entry points), which that flag does not time.
    """
    done = subprocess.run([sys.executable, "-c", _LOAD_EACH], cwd=ROOT, capture_output=True, text=True, check=True)
    return sorted(json.loads(done.stdout).items(), key=lambda item: -item[1])

if __name__ == "__main__":
    main()
