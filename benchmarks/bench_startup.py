"""How long does a command take to start?

Times each command in a fresh interpreter (median of ``--repeats`` runs, interleaved) and
prints it next to the peer every PyTorch command line pays at least once, ``python -c
"import torch"``, measured in the same run, with the ratio ours / import-torch. The
commands that show help, list components, print the schema or validate specs should not
import torch at all (tests/core/test_startup.py asserts that by ``sys.modules``); their
ratio is how much of torch's start-up they save. ``validate`` is timed on one spec and on
every example spec in ``specs/`` at once (each component's declared size check, no model
built). Targets on a 2-core machine: ``--help`` < 0.5 s, ``validate`` < 1.5 s, and the
ratio well under 1.

    python benchmarks/bench_startup.py
    python benchmarks/bench_startup.py --repeats 7 --spec specs/tiny.yaml
"""

from __future__ import annotations

import argparse
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


if __name__ == "__main__":
    main()
