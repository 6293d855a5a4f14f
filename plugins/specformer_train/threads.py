"""How many CPU threads PyTorch uses for a run on the CPU.

PyTorch's default, one thread per physical core, is the fastest on an idle machine, but
when other programs keep some cores busy its threads wait for each other at every
parallel region and a small model can train tens of times slower than on one thread.
``threads: auto`` therefore takes one thread per core the 1-minute load average shows
idle (at least one), unless ``OMP_NUM_THREADS`` says otherwise (``torchrun`` sets it).
Matrix products can round differently with another thread count, so a resumed run uses
the count its checkpoint was saved with: its numbers then match the uninterrupted run's.
"""

from __future__ import annotations

import os

import torch

_DEFAULT = torch.get_num_threads()  # PyTorch's own choice at import: the physical cores


def auto_threads() -> int:
    """One thread per core not already busy, within PyTorch's default; ``OMP_NUM_THREADS`` when set."""
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    try:
        busy = os.getloadavg()[0]
        available = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no load average (Windows): keep PyTorch's default
        return _DEFAULT
    return max(1, min(_DEFAULT, int(available - busy + 0.5)))


def choose_threads(requested: int | str, *, saved: int | None = None) -> int:
    """The thread count for ``train.threads`` (``auto`` or a number), keeping ``saved`` on a resume."""
    if requested == "auto":
        return saved if saved else auto_threads()
    return int(requested)
