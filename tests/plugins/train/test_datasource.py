"""A run records its data source; --resume continues on it, and other data needs --new-data."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import specformer
from specformer_train import datasource, train
from specformer_train.datasource import fingerprint_tokens
from specformer_train.metrics import read_metrics

from .conftest import make_text, tiny_train_spec


def losses(out: Path) -> list[float]:
    return [r["loss"] for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "train"]


def test_the_fingerprint_is_the_sha256_of_the_ids_and_their_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    ids = np.array([1, 2, 300, 7, 9], dtype=np.uint16)
    expected = "sha256:" + hashlib.sha256(b"<u2" + ids.tobytes()).hexdigest()
    assert fingerprint_tokens(ids) == expected
    monkeypatch.setattr(datasource, "_CHUNK", 2)  # hashed slice by slice: the same digest
    assert fingerprint_tokens(ids) == expected
    assert fingerprint_tokens(ids.astype(np.uint32)) != expected


@pytest.fixture
def two_corpora(tmp_path: Path, corpus_dir: Path) -> tuple[Path, Path]:
    other = tmp_path / "other.txt"
    other.write_text(make_text(6000, seed=99))
    return corpus_dir, other


def settings(out: Path, spec_data: Path, **extra: Any) -> dict[str, Any]:
    # The spec names `spec_data`; runs are started with another --data, as in the issue.
    return tiny_train_spec(data=str(spec_data), out_dir=str(out),
                           **{"steps": 8, "save_every": 4, "eval_every": 4, **extra})


def test_resume_without_data_continues_on_the_recorded_data(tmp_path: Path, two_corpora,
                                                           capsys: pytest.CaptureFixture) -> None:
    chosen, in_spec = two_corpora
    uninterrupted = tmp_path / "a"
    train(settings(uninterrupted, in_spec), data=str(chosen))
    record = json.loads((uninterrupted / "checkpoints" / "step-0000008" / "trainer.json").read_text())["data"]
    assert record["data"] == str(chosen.absolute()) and record["fingerprint"].startswith("sha256:")
    assert record["tokens"] > 30_000 and record["description"].endswith("(3 files)")

    resumed = tmp_path / "b"
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copytree(uninterrupted / "checkpoints" / "step-0000004", resumed / "checkpoints" / "step-0000004")
    (resumed / "checkpoints" / "latest").write_text("step-0000004")
    capsys.readouterr()
    train(settings(resumed, in_spec), resume=True)  # no --data: the spec's own data would be `in_spec`
    assert "note: resuming on the data the run was trained on:" in capsys.readouterr().out
    assert losses(resumed) == losses(uninterrupted)[4:]  # steps 5-8, on the recorded data
    again = json.loads((resumed / "checkpoints" / "step-0000008" / "trainer.json").read_text())["data"]
    assert again == record


def test_other_data_on_resume_is_refused_unless_new_data_is_given(tmp_path: Path, two_corpora,
                                                                  capsys: pytest.CaptureFixture) -> None:
    chosen, other = two_corpora
    out = tmp_path / "run"
    train(settings(out, chosen, steps=4))
    with pytest.raises(specformer.UserError, match=r"--resume: the data differs from what the run was trained on "
                                                   r"\(was .*corpus \(3 files\) \(\d[\d,]* tokens, sha256 [0-9a-f]{12}\), "
                                                   r"now .*other.txt .*--new-data"):
        train(settings(out, chosen, steps=6), data=str(other), resume=True)
    train(settings(out, chosen, steps=6), data=str(chosen), resume=True)  # the same data, named: fine
    capsys.readouterr()
    result = train(settings(out, chosen, steps=8), data=str(other), resume=True, new_data=True)
    assert "note: continuing on new data: was " in capsys.readouterr().out and result.step == 8
    record = json.loads((out / "checkpoints" / "step-0000008" / "trainer.json").read_text())["data"]
    assert record["data"] == str(other.absolute())


def test_data_edited_in_place_is_noticed_and_vanished_data_is_explained(tmp_path: Path, two_corpora) -> None:
    chosen, _ = two_corpora
    out = tmp_path / "run"
    train(settings(out, chosen, steps=4))
    (chosen / "doc0.txt").write_text(make_text(2000, seed=1234))
    with pytest.raises(specformer.UserError, match="the data differs from what the run was trained on"):
        train(settings(out, chosen, steps=6), resume=True)
    shutil.rmtree(chosen)
    with pytest.raises(specformer.UserError, match=r"--resume: the run was trained on .*corpus, which cannot be read "
                                                   r"now .*give its new place with --data PATH"):
        train(settings(out, chosen, steps=6), resume=True)
