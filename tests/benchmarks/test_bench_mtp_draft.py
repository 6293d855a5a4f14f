"""benchmarks/bench_mtp_draft.py at toy size: it trains, times every drafter, and greedy drafting keeps the plain tokens."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
DATA = BENCHMARKS.parents[1] / "shared" / "data" / "tinyshakespeare.txt"
spec = importlib.util.spec_from_file_location("bench_mtp_draft", BENCHMARKS / "bench_mtp_draft.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.slow  # trains a tiny model for 20 steps, then generates with three drafters: up to a minute under load
def test_the_benchmark_runs_every_drafter_and_keeps_the_plain_tokens(capsys, tmp_path) -> None:
    data = DATA if DATA.is_file() else tmp_path / "text.txt"
    if not DATA.is_file():  # any text will do for a smoke run
        data.write_text(Path(bench.__file__).read_text() * 20)
    assert bench.main(["--quick", "--data", str(data)]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split(" ", 1)[0] in ("none", "ngram", "mtp")}
    assert sorted(rows) == ["mtp", "ngram", "none"]
    assert float(rows["mtp"][2]) > 0 and rows["mtp"][4].endswith("%")
    assert "equal plain decoding: yes" in out
