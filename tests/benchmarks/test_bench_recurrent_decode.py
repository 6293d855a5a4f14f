"""benchmarks/bench_recurrent_decode.py at toy sizes: a row per family, ours and transformers' decoding the same tokens."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
spec = importlib.util.spec_from_file_location("bench_recurrent_decode", BENCHMARKS / "bench_recurrent_decode.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.slow  # six transformers models saved, imported and decoded twice each: about a minute
def test_every_family_decodes_the_tokens_transformers_decodes(capsys) -> None:
    pytest.importorskip("transformers")
    assert bench.main(["--quick"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split(" ", 1)[0] in bench.FAMILIES}
    assert sorted(rows) == sorted(bench.FAMILIES)
    for family, row in rows.items():
        assert row[-1] == "100%", family  # the same weights decode to the same greedy tokens
        assert float(row[-2]) > 0, family
    assert "a Mamba-1 step takes" in out


def test_rwkv_prefill_forms_agree(capsys) -> None:
    """--prefill: the chunked WKV, the token loop and transformers give the same last logits (a row each)."""
    pytest.importorskip("transformers")
    assert bench.main(["--quick", "--family", "rwkv", "--prefill", "40"]) == 0
    out = capsys.readouterr().out
    rows = {line[:14].strip(): line.split() for line in out.split("rwkv prefill of a 40-token prompt")[1].splitlines()[2:]}
    assert sorted(rows) == ["chunked", "token loop", "transformers"]
    for form, row in rows.items():
        assert float(row[-1]) < 1e-3, form


@pytest.mark.parametrize(("argv", "message"), [
    (["--repeats", "0"], "expected a positive int, got '0'"),
    (["--family", "llama"], "invalid choice: 'llama'"),
])
def test_bad_arguments_are_refused_in_one_line(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        bench.main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
