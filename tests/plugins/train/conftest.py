"""Shared fixtures of the train plugin's tests: a tiny model spec and a small real-looking corpus
(tests/fixtures/tiny_train.py and tests/fixtures/corpus.py, which the text plugin's tests share)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

import specformer_train.progress
from fixtures.corpus import _private_cache, corpus_dir, make_text  # noqa: F401  (fixtures of this folder)
from fixtures.tiny_train import TINY_MODEL, TINY_TRAIN, tiny_train_spec  # noqa: F401  (the tests' imports)


@pytest.fixture(autouse=True)
def _tiny_models_on_one_thread(one_thread: None) -> None:
    """Every training test on one thread (tests/conftest.py's ``one_thread``)."""


@pytest.fixture
def spec_file(tmp_path: Path, corpus_dir: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_train_spec(data=str(corpus_dir))), encoding="utf-8")
    return path


class NaNFrom:
    """Makes the final norm's output NaN from the ``n``-th training forward on."""

    def __init__(self, n: int) -> None:
        self.calls, self.n = 0, n

    def __call__(self, module: torch.nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
        if module.training:
            self.calls += 1
            if self.calls >= self.n:
                return output * float("nan")
        return output


@pytest.fixture
def thread_count_recorded_not_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer's thread count is checked as the count it asks torch for, and torch keeps one thread.

    The mutation run forks one child per mutant from a process that has run these tests; once a
    test had trained on two threads there, libgomp's thread team did not survive the fork and the
    child's next parallel region waited forever (gdb: ``gomp_team_barrier_wait_end``), which mutmut
    then counted as a kill by timeout.
    """
    asked = [torch.get_num_threads()]
    monkeypatch.setattr(torch, "set_num_threads", asked.append)
    monkeypatch.setattr(torch, "get_num_threads", lambda: asked[-1])


@pytest.fixture
def progress_bars_without_a_shared_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    """tqdm's bars (disabled ones too) here take a process-local lock and start no monitor thread.

    By default tqdm guards its bars with a ``multiprocessing`` lock, a semaphore that forked
    processes share, and a monitor thread takes it every 10 s. In the mutation run every mutant is
    a forked child; one that exited (or was killed) while its monitor thread held the semaphore
    left it taken, and every later child then waited for it forever and was counted as killed by
    timeout (gdb: ``SemLock.acquire`` in ``tqdm.__new__``).
    """
    bar_class = specformer_train.progress.tqdm
    monkeypatch.setattr(bar_class, "_lock", threading.RLock(), raising=False)
    monkeypatch.setattr(bar_class, "monitor_interval", 0)
