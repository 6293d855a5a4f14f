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


def rows(out: str, mixer: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if line.startswith(mixer + " ")]


def test_decode_prints_a_row_per_mixer_and_context(capsys) -> None:
    assert bench_hybrid.main(["--quick", "--part", "decode"]) == 0
    decode = rows(capsys.readouterr().out, "short_conv")
    assert [row[1] for row in decode] == [str(c) for c in bench_hybrid.QUICK.contexts]
    assert all(float(row[-1]) < 1 for row in decode)  # the hybrid's cache is smaller than all-attention's


def test_prefill_in_one_forward_and_token_by_token_agree(capsys) -> None:
    assert bench_hybrid.main(["--quick", "--part", "prefill"]) == 0
    (row,) = rows(capsys.readouterr().out, "short_conv")
    assert float(row[-1]) < 1e-4  # both leave the same logits


@pytest.mark.slow  # transformers' import and an export: a few seconds
def test_the_training_step_against_transformers_lfm2(capsys) -> None:
    pytest.importorskip("transformers")
    assert bench_hybrid.main(["--quick", "--part", "train"]) == 0
    (row,) = rows(capsys.readouterr().out, "short_conv")
    assert row[1] == "Lfm2ForCausalLM" and float(row[-1]) < 1e-4  # the same weights: the same logits


def test_repeats_below_one_are_refused_in_one_line(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        bench_hybrid.main(["--repeats", "0"])
    assert exit_.value.code == 2
    assert "--repeats must be at least 1, got 0" in capsys.readouterr().err
