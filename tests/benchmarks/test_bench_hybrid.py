"""benchmarks/bench_hybrid.py at its smallest configuration (``--quick``): every part runs and prints its rows."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_hybrid.py"
spec = importlib.util.spec_from_file_location("bench_hybrid", PATH)
bench_hybrid = importlib.util.module_from_spec(spec)
sys.modules["bench_hybrid"] = bench_hybrid  # dataclasses look their module up
spec.loader.exec_module(bench_hybrid)

pytestmark = pytest.mark.usefixtures("one_thread")  # toy sizes: one thread is fastest (tests/conftest.py)


def rows(out: str) -> dict[str, list[list[str]]]:
    """The table rows of the output by mixer (first column)."""
    table: dict[str, list[list[str]]] = {}
    for line in out.splitlines():
        if line.split(" ", 1)[0] in bench_hybrid.MIXERS:
            table.setdefault(line.split()[0], []).append(line.split())
    return table


def registered() -> list[str]:
    return bench_hybrid.available_mixers()[0]


@pytest.mark.slow  # builds and fills caches for two models per mixer: a few seconds
def test_decode_prints_a_row_per_mixer_and_context(capsys) -> None:
    assert bench_hybrid.main(["--quick", "--part", "decode"]) == 0
    table = rows(capsys.readouterr().out)
    assert sorted(table) == sorted(registered()) and "short_conv" in table
    for name, decode in table.items():
        assert [row[1] for row in decode] == [str(c) for c in bench_hybrid.QUICK.contexts], name
    # short_conv keeps 2 inputs per channel: its hybrid's cache is smaller than all-attention's at any context
    assert all(float(row[-1]) < 1 for row in table["short_conv"])


def test_prefill_in_one_forward_and_token_by_token_agree(capsys) -> None:
    assert bench_hybrid.main(["--quick", "--part", "prefill"]) == 0
    table = rows(capsys.readouterr().out)
    assert sorted(table) == sorted(registered())
    for name, (row,) in table.items():
        assert float(row[-1]) < 1e-4, name  # both forms leave the same logits


@pytest.mark.slow  # transformers' import, an export and an import: a few seconds
def test_the_training_step_against_transformers_with_the_same_weights(capsys) -> None:
    pytest.importorskip("transformers")
    assert bench_hybrid.main(["--quick", "--part", "train"]) == 0
    table = rows(capsys.readouterr().out)
    assert table["short_conv"][0][1] == "Lfm2ForCausalLM"
    for name, (row,) in table.items():
        assert float(row[-1]) < 1e-4, name  # the same weights: the same outputs


@pytest.mark.parametrize("flag", ["--repeats", "--threads"])
def test_counts_below_one_are_refused_in_one_line(flag: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        bench_hybrid.main([flag, "0"])
    assert exit_.value.code == 2
    assert f"{flag} must be at least 1, got 0" in capsys.readouterr().err
