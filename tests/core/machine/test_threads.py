"""CPU threads for any command: one per idle core, within PyTorch's default; OMP_NUM_THREADS respected."""

from __future__ import annotations

import os

import pytest
import torch

from specformer.machine import threads
from specformer.machine.threads import auto_threads


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


def test_use_threads_sets_the_count_or_names_the_option() -> None:
    from specformer.errors import UserError
    from specformer.machine.threads import use_threads

    before = torch.get_num_threads()
    try:
        assert use_threads("1") == 1 and torch.get_num_threads() == 1
        with pytest.raises(UserError, match=r"--workers must be a number >= 1 or auto, got '0'"):
            use_threads("0", option="--workers")
    finally:
        torch.set_num_threads(before)
