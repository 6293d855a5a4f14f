"""Connection limits uvicorn lacks: a deadline for a request's head.

uvicorn bounds concurrent connections (``limit_concurrency``: past it, requests get 503)
and idle keep-alive connections (``timeout_keep_alive``, armed once a response is sent),
and h11 bounds the size of a request head (16 KiB). Nothing bounds how long a client may
take to send the head: a fresh connection that sends nothing, or half a header and then
nothing, or one byte a minute, stays open for ever, and enough of them exhaust the
server's connections. :class:`HeadDeadlineProtocol` is uvicorn's h11 protocol with that
deadline: from the moment a connection opens (or the first byte of a later request on a
kept-alive one), the whole head must arrive within ``header_timeout`` seconds, else the
connection gets a 408 and is closed. The body's deadline is the application's
(:func:`specformer_serve.app.create_app`), which reads the body.

The server selects this protocol explicitly, so it is h11 whether or not httptools is
installed: the deadline is kept the same way everywhere.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

_TIMED_OUT_BODY = b"the request line and headers did not arrive in time\n"
_TIMED_OUT = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
              b"content-length: %d\r\n\r\n%s" % (len(_TIMED_OUT_BODY), _TIMED_OUT_BODY))


def head_deadline_protocol(header_timeout: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol class, closing a connection whose request head is incomplete after ``header_timeout``."""

    class HeadDeadlineProtocol(H11Protocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_head_timer()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            # Still IDLE on the client's side: the head of its next request is not complete yet.
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                if self._head_timer is None:
                    self._arm_head_timer()
            else:
                self._cancel_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_head_timer()
            super().connection_lost(exc)

        def _arm_head_timer(self) -> None:
            self._head_timer = self.loop.call_later(header_timeout, self._head_timed_out)

        def _cancel_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                # Written directly: h11 will not send a response to a request it has not seen.
                self.transport.write(_TIMED_OUT)
                self.transport.close()

    return HeadDeadlineProtocol
