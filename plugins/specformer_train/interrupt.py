"""Ctrl-C during training: finish the current step, save a checkpoint, exit cleanly.

The first SIGINT only raises a flag that the training loop reads between steps; a
second one interrupts at once (Python's usual KeyboardInterrupt), for when saving
itself hangs.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType


class StopOnInterrupt:
    """A context manager whose ``requested`` becomes True on the first Ctrl-C."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: object = None
        self._installed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self) -> "StopOnInterrupt":
        # Signal handlers can only be set from the main thread; elsewhere Ctrl-C keeps its default.
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)  # type: ignore[arg-type]
            self._installed = False
