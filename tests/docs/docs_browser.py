"""Drive headless Chromium over the DevTools protocol, with nothing but the standard library.

Chromium started with ``--remote-debugging-pipe`` reads protocol messages on file
descriptor 3 and writes them on 4, each a JSON object ending in a NUL byte; no websocket
and no third-party client is needed. Everything stays on this machine: the browser is
started with networking features off and only ever pointed at a 127.0.0.1 server.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import http.server
import json
import os
import select
import shlex
import shutil
import socketserver
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator

CHROMIUM = Path("/usr/bin/chromium")

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
]


class BrowserError(RuntimeError):
    pass


class Browser:
    """One headless Chromium and one page in it."""

    def __init__(self, *, width: int = 1400, height: int = 1000, timeout: float = 30.0) -> None:
        self.timeout = timeout
        self._profile = tempfile.mkdtemp(prefix="specformer-chromium-")
        to_browser_read, self._to_browser = os.pipe()
        self._from_browser, from_browser_write = os.pipe()
        # Move the browser's ends above 9 so that placing them at 3 and 4 cannot clobber them.
        to_browser_read, from_browser_write = (_above_nine(fd) for fd in (to_browser_read, from_browser_write))
        command = [str(CHROMIUM), *FLAGS, f"--user-data-dir={self._profile}", f"--window-size={width},{height}", "about:blank"]
        # The protocol pipe must be fds 3 and 4 in the browser; the shell moves them there.
        script = f"exec 3<&{to_browser_read} 4>&{from_browser_write} {to_browser_read}<&- {from_browser_write}>&-; exec {shlex.join(command)}"
        self._process = subprocess.Popen(
            ["/bin/bash", "-c", script],  # dash cannot redirect descriptors above 9
            pass_fds=(to_browser_read, from_browser_write),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_read)
        os.close(from_browser_write)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        targets = self.call("Target.getTargets")["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        self.session = self.call("Target.attachToTarget", targetId=page["targetId"], flatten=True)["sessionId"]
        self.call("Page.enable", session=True)
        self.call("Runtime.enable", session=True)

    # -- protocol -----------------------------------------------------------------------

    def call(self, method: str, *, session: bool = False, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise BrowserError("Chromium did not answer in time")
            if self._process.poll() is not None:
                raise BrowserError(f"Chromium exited with code {self._process.returncode}")
            ready, _, _ = select.select([self._from_browser], [], [], 0.2)
            if ready:
                chunk = os.read(self._from_browser, 1 << 20)
                if not chunk:
                    raise BrowserError("Chromium closed the protocol pipe")
                self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    # -- page helpers --------------------------------------------------------------------

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression!r} raised {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, *, timeout: float | None = None) -> Any:
        """Poll ``expression`` until it is truthy; return its value."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.2)
        raise BrowserError(f"timed out waiting for {expression}")

    def goto(self, url: str) -> None:
        self.call("Page.navigate", session=True, url=url)
        self.wait_for(f"document.readyState === 'complete' && location.href.startsWith({json.dumps(url.split('#')[0])})")

    def type_text(self, text: str) -> None:
        for char in text:  # key by key, as a person types: the search box reacts to key events
            self.call("Input.dispatchKeyEvent", session=True, type="keyDown", text=char, key=char,
                      unmodifiedText=char)
            self.call("Input.dispatchKeyEvent", session=True, type="keyUp", key=char)

    def screenshot(self, path: Path, *, full_page: bool = False) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
            params["clip"] = {"x": 0, "y": 0, "width": size[0], "height": min(size[1], 12000), "scale": 1}
            params["captureBeyondViewport"] = True
        data = self.call("Page.captureScreenshot", session=True, **params)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.call("Browser.close")
        with contextlib.suppress(Exception):
            self._process.wait(timeout=10)
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait(timeout=10)
        for fd in (self._to_browser, self._from_browser):
            with contextlib.suppress(OSError):
                os.close(fd)
        shutil.rmtree(self._profile, ignore_errors=True)


def _above_nine(fd: int) -> int:
    import fcntl

    high = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return high


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


@contextlib.contextmanager
def serve(directory: Path) -> Iterator[str]:
    """Serve ``directory`` on 127.0.0.1 at a free port; yield the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler) as server:
        server.daemon_threads = True
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}/"
        finally:
            server.shutdown()
