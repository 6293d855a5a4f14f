"""Training threads: the core's idle-core rule for ``auto``, an explicit count, the saved count kept on resume."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from specformer_train import threads, train
from specformer_train.threads import choose_threads

from .conftest import tiny_train_spec


def test_explicit_counts_and_resumed_runs() -> None:
    assert choose_threads(6) == 6
    assert choose_threads("auto", saved=2) == 2
    assert choose_threads(6, saved=2) == 6, "an explicit setting wins over the saved count"


def test_a_resumed_auto_run_keeps_the_saved_count(tmp_path: Path, corpus_dir: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    train(tiny_train_spec(data=str(corpus_dir), out_dir=str(tmp_path / "run"), steps=4, save_every=2, threads=1))
    state = json.loads((tmp_path / "run" / "checkpoints" / "step-0000004" / "trainer.json").read_text())
    assert state["threads"] == 1
    monkeypatch.setattr(threads, "auto_threads", lambda: 2)
    train(tiny_train_spec(data=str(corpus_dir), out_dir=str(tmp_path / "run"), steps=6, threads="auto"), resume=True)
    assert torch.get_num_threads() == 1
