"""CPU threads: one per idle core by default, OMP_NUM_THREADS respected, the saved count kept on resume."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from specformer_train import threads, train
from specformer_train.threads import auto_threads, choose_threads

from .conftest import tiny_spec


def test_auto_takes_one_thread_per_idle_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "_DEFAULT", 8)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    for load, expected in ((0.2, 8), (3.4, 5), (7.6, 1), (20.0, 1)):
        monkeypatch.setattr(os, "getloadavg", lambda load=load: (load, load, load))
        assert auto_threads() == expected, load
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setattr(threads, "_DEFAULT", 4)  # never more than PyTorch's own default (physical cores)
    assert auto_threads() == 4
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert auto_threads() == 3


def test_explicit_counts_and_resumed_runs() -> None:
    assert choose_threads(6) == 6
    assert choose_threads("auto", saved=2) == 2
    assert choose_threads(6, saved=2) == 6, "an explicit setting wins over the saved count"


def test_a_resumed_auto_run_keeps_the_saved_count(tmp_path: Path, corpus_dir: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    train(tiny_spec(data=str(corpus_dir), out_dir=str(tmp_path / "run"), steps=4, save_every=2, threads=1))
    state = json.loads((tmp_path / "run" / "checkpoints" / "step-0000004" / "trainer.json").read_text())
    assert state["threads"] == 1
    monkeypatch.setattr(threads, "auto_threads", lambda: 2)
    train(tiny_spec(data=str(corpus_dir), out_dir=str(tmp_path / "run"), steps=6, threads="auto"), resume=True)
    assert torch.get_num_threads() == 1
