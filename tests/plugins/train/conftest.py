"""Shared fixtures of the train plugin's tests: a tiny model spec and a small real-looking corpus."""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

import specformer_train.progress
from fixtures.tiny import tiny_spec

WORDS = (
    "the model reads tokens and predicts the next one while the optimizer follows the gradient of the loss "
    "def return class import for while if else with as yield lambda None True False self value index "
    "alpha beta gamma delta epsilon river mountain forest ocean city night morning light shadow"
).split()

#: Byte-token vocabulary, 2 heads without grouping, a wider ffn: the model these tests were tuned on, as changes
#: to the shared tiny model.
TINY_CHANGES: dict[str, Any] = {
    "vocab_size": 259, "block": {"mixer": {"kind": "attention", "n_heads": 2}, "ffn": {"kind": "swiglu", "hidden": 64}},
}
TINY_MODEL: dict[str, Any] = tiny_spec(**TINY_CHANGES)["model"]

TINY_TRAIN: dict[str, Any] = {
    "steps": 8,
    "batch_size": 4,
    "lr": 3e-3,
    "min_lr": 3e-4,
    "warmup_steps": 2,
    "eval_every": 4,
    "eval_steps": 2,
    "save_every": 4,
    "sample_tokens": 0,
    "progress": False,
    "plot": False,
    "tensorboard": False,
    "threads": 1,
}


def make_text(n_words: int, *, seed: int) -> str:
    rng = random.Random(seed)
    lines = []
    while n_words > 0:
        k = min(n_words, rng.randint(4, 12))
        lines.append(" ".join(rng.choice(WORDS) for _ in range(k)))
        n_words -= k
    return "\n".join(lines) + "\n"


@pytest.fixture(autouse=True)
def _tiny_models_on_one_thread(one_thread: None) -> None:
    """Every training test on one thread (tests/conftest.py's ``one_thread``)."""


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("SPECFORMER_CACHE", str(cache))
    return cache


@pytest.fixture
def corpus_dir(tmp_path: Path) -> Path:
    """Three text documents, ~6k words in all."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    for i in range(3):
        (folder / f"doc{i}.txt").write_text(make_text(2000, seed=i), encoding="utf-8")
    return folder


def tiny_train_spec(**train: Any) -> dict[str, Any]:
    """The tiny model with ``TINY_TRAIN`` as its train section, ``train`` changing its fields."""
    return tiny_spec(**TINY_CHANGES, train={**TINY_TRAIN, **train})


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
