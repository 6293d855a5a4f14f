"""Putting a model on the network: the engine thread plus uvicorn on a socket bound up front.

:class:`Server` is used three ways: ``specformer serve`` runs it in the foreground
(:meth:`Server.run`), and tests and ``benchmarks/bench_serve.py`` start it on a background
thread (``with Server(...) as server: server.url``). The socket is bound before uvicorn
starts, so a port that is taken is one clear error and port 0 picks a free one.

Connections are bounded: at most ``max_connections`` at once (uvicorn answers requests past
that with 503), a request head must arrive within ``header_timeout`` seconds
(:mod:`.connections`), an idle kept-alive connection is closed after ``keep_alive`` seconds;
the body's deadline is the application's (``ServeConfig.body_timeout``).
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from specformer_serve.app import ServeConfig, create_app
from specformer_serve import limits
from specformer_serve.connections import head_deadline_protocol
from specformer_serve.engine import Engine


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (OSError when it cannot be had)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


class Server:
    """An engine and its HTTP server on one bound socket."""

    def __init__(self, engine: Engine, config: ServeConfig, *, host: str = "127.0.0.1", port: int = 0,
                 log_level: str = "warning", header_timeout: float = limits.HEADER_TIMEOUT,
                 max_connections: int = limits.MAX_CONNECTIONS, keep_alive: int = limits.KEEP_ALIVE) -> None:
        import uvicorn  # late: the HTTP stack is an optional extra

        self.engine = engine
        self.socket = bind(host, port)
        self.host, self.port = self.socket.getsockname()[:2]
        app = create_app(engine, config, bound=self.host)
        # timeout_graceful_shutdown: open streams are closed rather than waited for on Ctrl-C.
        self._uvicorn = uvicorn.Server(uvicorn.Config(
            app, log_level=log_level, timeout_graceful_shutdown=2, access_log=False,
            http=head_deadline_protocol(header_timeout), limit_concurrency=max_connections,
            timeout_keep_alive=keep_alive))
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def run(self) -> None:
        """Serve in the foreground until interrupted (Ctrl-C), then stop the engine."""
        self.engine.start()
        try:
            self._uvicorn.run(sockets=[self.socket])
        finally:
            self.engine.stop()
            self.socket.close()

    # -- in the background (tests, benchmarks) ------------------------------------------------------

    def __enter__(self) -> "Server":
        self.engine.start()
        # uvicorn installs signal handlers only on the main thread, so a background server leaves them alone.
        self._thread = threading.Thread(target=self._uvicorn.run, kwargs={"sockets": [self.socket]}, daemon=True,
                                        name="specformer-serve-http")
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._uvicorn.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the HTTP server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.engine.stop()
        self.socket.close()
