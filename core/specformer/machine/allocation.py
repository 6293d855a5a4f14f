"""An allocation that failed, told as one line at the command boundary.

The memory checks (:mod:`specformer.machine.memory`, ``specformer_generate.memory``) refuse
what their estimates say will not fit, before anything large is allocated. An estimate
counts the big buffers only, and ``--max-memory unlimited`` turns the check off, so an
allocation can still fail: PyTorch then raises a ``RuntimeError`` from its allocator
(``DefaultCPUAllocator: can't allocate memory: you tried to allocate N bytes``, or a bare
``std::bad_alloc``), ``torch.OutOfMemoryError`` on CUDA, or Python's ``MemoryError``. The
CLI turns any of them into this module's one line (exit 2) instead of a traceback.

This module imports no torch: the CLI imports it at start-up.
"""

from __future__ import annotations

import re

from specformer.messages import format_bytes

_ALLOCATOR_FAILED = re.compile(r"can't allocate memory|not enough memory|out of memory|std::bad_alloc", re.IGNORECASE)
_TRIED = re.compile(r"tried to allocate (\d+) bytes|tried to allocate (\d+(?:\.\d+)?) ?([KMGT]i?B)", re.IGNORECASE)
_UNITS = {"K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def is_allocation_failure(exc: BaseException) -> bool:
    """True when ``exc`` says that memory could not be had (not a user's mistake found by a check)."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    return isinstance(exc, RuntimeError) and bool(_ALLOCATOR_FAILED.search(str(exc)))


def requested_bytes(exc: BaseException) -> int | None:
    """The size of the allocation that failed, where the allocator's message gives it."""
    found = _TRIED.search(str(exc))
    if found is None:
        return None
    if found.group(1):
        return int(found.group(1))
    return int(float(found.group(2)) * _UNITS[found.group(3)[0].upper()])


def allocation_failure_message(exc: BaseException, *, command: str) -> str:
    """One line: which command ran out, how much it asked for, and how to ask for less."""
    size = requested_bytes(exc)
    asked = f"an allocation of {format_bytes(size)} failed" if size is not None else "an allocation failed"
    return (f"specformer {command} ran out of memory: {asked} (the memory check counts only the large buffers, "
            f"or was turned off with --max-memory unlimited); ask for less (fewer prompts, beams or new tokens, a "
            f"smaller batch or sequence length, a lower-precision dtype) or run where more memory is free (the "
            f"machine's, a ulimit -v or a container's memory limit)")


__all__ = ["allocation_failure_message", "is_allocation_failure", "requested_bytes"]
