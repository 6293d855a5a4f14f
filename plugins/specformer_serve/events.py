"""Getting engine events (tokens, ends) from the engine thread to the asyncio event loop cheaply.

The engine emits one event per running request per step. Waking the event loop for each
(``call_soon_threadsafe`` writes to the loop's self-pipe) costs a system call and a thread
switch apiece, and the engine thread then waits to get the GIL back; with 16 streams that
was a large share of a step. So events are only collected as they are emitted, and the
engine's step listener wakes the loop once per turn to deliver all of them.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from starlette.requests import Request

from specformer_serve.engine import Engine


class Poster:
    """Hands engine events to the event loop, waking it once per engine turn rather than once per token.

    The engine thread emits one event per running request per step; waking the loop for each
    (``call_soon_threadsafe`` writes to its self-pipe) costs a system call and a thread switch
    apiece. Events wait in a list; the engine's step listener (:meth:`flush`, called after each
    turn) schedules one drain for all of them.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pending: list[tuple[asyncio.Queue, Any]] = []
        self.scheduled = False
        self.lock = threading.Lock()

    @classmethod
    def for_app(cls, request: Request, engine: Engine) -> "Poster":
        """The application's poster for the running event loop (one per loop, kept in the app's state)."""
        loop = asyncio.get_running_loop()
        poster = getattr(request.app.state, "poster", None)
        if poster is None or poster.loop is not loop:
            poster = request.app.state.poster = cls(loop)
            engine.add_step_listener(poster.flush)
        return poster

    def __call__(self, queue: asyncio.Queue, item: Any) -> None:
        with self.lock:
            self.pending.append((queue, item))

    def flush(self) -> None:
        with self.lock:
            if not self.pending or self.scheduled:
                return
            self.scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the event loop is gone (server shutting down)
            pass

    def _drain(self) -> None:
        with self.lock:
            pending, self.pending, self.scheduled = self.pending, [], False
        for queue, item in pending:
            queue.put_nowait(item)
