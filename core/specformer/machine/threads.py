"""How many CPU threads a command should use: one per idle core.

PyTorch's default, one thread per physical core, is the fastest on an idle machine, but
when other programs keep some cores busy its threads wait for each other at every
parallel region, and a small model can run tens of times slower than on one thread.
:func:`auto_threads` therefore takes one thread per core the 1-minute load average shows
idle (at least one), unless ``OMP_NUM_THREADS`` says otherwise (``torchrun`` sets it).
The same rule as training's ``threads: auto``; shared here so that every command
(``generate``, ``chat``, ...) can use it without importing another plugin.
"""

from __future__ import annotations

import os

import torch

from specformer.errors import UserError

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


def use_threads(value: str, *, option: str = "--threads") -> int:
    """Set PyTorch's CPU thread count from a command's ``--threads`` (a number or ``auto``); the count used.

    :class:`~specformer.errors.UserError` naming ``option`` for anything else.
    """
    if value == "auto":
        count = auto_threads()
    elif value.isdigit() and int(value) >= 1:
        count = int(value)
    else:
        raise UserError(f"{option} must be a number >= 1 or auto, got {value!r}")
    torch.set_num_threads(count)
    return count
