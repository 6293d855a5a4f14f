"""What a client cannot do to the server: stall it with a template, hold connections open, flood it, read its stats.

Slow clients are raw sockets to 127.0.0.1; every wait is a bounded loop with a generous
upper bound (ten times the configured timeout), never a tight timing assert.
"""

from __future__ import annotations

import html.parser
import json
import logging
import socket
import threading
import time
from typing import Any

import httpx
import pytest

from specformer_serve.chat_template import renderer_for
from specformer_serve.playground import page

from .conftest import MODEL_ID, make_server

CHAT = {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
OK = {"model": MODEL_ID, "prompt": "ok", "max_tokens": 3, "temperature": 0}
NESTED_LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


def test_liveness_is_public_and_the_statistics_need_the_key(model, server) -> None:
    health = httpx.get(f"{server.url}/health")
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    stats = httpx.get(f"{server.url}/v1/stats")  # no key configured: open, like every /v1/ route
    assert stats.status_code == 200 and stats.json()["total_blocks"] == 256
    with make_server(model, api_key="k") as keyed:
        assert httpx.get(f"{keyed.url}/health").json() == {"status": "ok"}
        refused = httpx.get(f"{keyed.url}/v1/stats")
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
        assert "free_blocks" not in refused.text
        stats = httpx.get(f"{keyed.url}/v1/stats", headers={"Authorization": "Bearer k"})
        assert stats.status_code == 200 and stats.json()["free_blocks"] == stats.json()["total_blocks"]


def test_a_hostile_template_is_a_4xx_naming_the_template_and_the_server_goes_on(model) -> None:
    render = renderer_for(NESTED_LOOPS, timeout=0.5)
    with make_server(model, config={"render_chat": render}) as server:
        r = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT, timeout=60)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == "messages"
        assert "chat template" in error["message"] and "time bound of 0.5 s" in error["message"]
        assert httpx.post(f"{server.url}/v1/completions", json=OK).status_code == 200


def test_health_answers_while_a_slow_template_renders(model) -> None:
    """Rendering runs off the event loop: a template busy until its bound does not hold other requests."""
    started = threading.Event()
    slow = renderer_for(NESTED_LOOPS, timeout=3)

    def render(messages: list[dict[str, Any]]) -> str:
        started.set()
        return slow(messages)

    order: list[str] = []
    with make_server(model, config={"render_chat": render}) as server:
        def chat() -> None:
            r = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT, timeout=60)
            order.append(f"chat {r.status_code}")

        client = threading.Thread(target=chat)
        client.start()
        assert started.wait(timeout=30)
        health = httpx.get(f"{server.url}/health", timeout=30)
        order.append(f"health {health.status_code}")
        client.join(timeout=60)
    assert order == ["health 200", "chat 400"]


def test_a_long_conversation_is_refused_before_it_is_rendered(model) -> None:
    rendered = []

    def render(messages: list[dict[str, Any]]) -> str:
        rendered.append(len(messages))
        return "x"

    with make_server(model, config={"render_chat": render, "max_messages": 100}) as server:
        flood = {**CHAT, "messages": [{"role": "user", "content": ""}] * 120_000}  # about 3.5 MB
        r = httpx.post(f"{server.url}/v1/chat/completions", json=flood, timeout=60)
        assert r.status_code == 413, r.text
        assert r.json()["error"]["param"] == "messages" and "at most 100" in r.json()["error"]["message"]
        fits = {**CHAT, "messages": [{"role": "user", "content": "a"}] * 100}
        assert httpx.post(f"{server.url}/v1/chat/completions", json=fits, timeout=60).status_code == 200
    assert rendered == [100]


def test_a_body_over_the_limit_is_refused_without_being_read(model) -> None:
    with make_server(model, config={"max_body_bytes": 1000}) as server:
        r = httpx.post(f"{server.url}/v1/completions", json={**OK, "prompt": "x" * 2000})
        assert r.status_code == 413 and "1,000 bytes" in r.json()["error"]["message"]
        assert r.headers["connection"] == "close"
        assert httpx.post(f"{server.url}/v1/completions", json=OK).status_code == 200


def _connect(server: Any) -> socket.socket:
    sock = socket.create_connection((server.host, server.port), timeout=30)
    return sock


def _closed_within(sock: socket.socket, seconds: float) -> bytes:
    """Everything the server sent until it closed the connection; fails if it is still open after ``seconds``."""
    sock.settimeout(0.2)
    received = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            piece = sock.recv(65536)
        except socket.timeout:
            continue
        except ConnectionResetError:
            return received
        if not piece:
            return received
        received += piece
    raise AssertionError(f"the server kept the connection open for {seconds} s; it sent {received!r}")


def test_slow_clients_are_closed_after_their_timeouts_and_others_are_served(model) -> None:
    header_timeout, body_timeout = 0.5, 1.0
    with make_server(model, config={"body_timeout": body_timeout}, header_timeout=header_timeout) as server:
        silent = _connect(server)  # connects and sends nothing
        half_head = _connect(server)
        half_head.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty")
        trickler = _connect(server)
        trickler.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000\r\n\r\n{")
        stop = threading.Event()

        def trickle() -> None:  # one byte every 0.05 s, well under any per-byte timeout
            while not stop.wait(0.05):
                try:
                    trickler.sendall(b" ")
                except OSError:
                    return

        threading.Thread(target=trickle, daemon=True).start()
        try:
            # Meanwhile others are answered.
            assert httpx.get(f"{server.url}/health").status_code == 200
            assert httpx.post(f"{server.url}/v1/completions", json=OK).status_code == 200
            assert _closed_within(silent, 10 * header_timeout).startswith(b"HTTP/1.1 408")
            assert _closed_within(half_head, 10 * header_timeout).startswith(b"HTTP/1.1 408")
            answer = _closed_within(trickler, 10 * body_timeout)
        finally:
            stop.set()
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert b"did not arrive within 1 s" in answer
        assert httpx.post(f"{server.url}/v1/completions", json=OK).status_code == 200


def test_connections_past_the_bound_are_answered_503_until_the_stalled_ones_are_closed(model) -> None:
    with make_server(model, header_timeout=0.5, max_connections=3) as server:
        stalled = [_connect(server) for _ in range(3)]
        for sock in stalled:
            sock.sendall(b"GET /health HTTP/1.1\r\n")
        time.sleep(0.1)  # let the server take the three connections before the next one
        assert httpx.get(f"{server.url}/health").status_code == 503
        for sock in stalled:
            _closed_within(sock, 5)
        assert httpx.get(f"{server.url}/health").status_code == 200


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_client_that_drops_mid_upload_is_one_log_line(model) -> None:
    records = _Records()
    with make_server(model) as server:
        # uvicorn configures its loggers when the server is made: listen after that.
        watched = [logging.getLogger(name) for name in ("specformer.serve", "uvicorn.error")]
        for logger in watched:
            logger.addHandler(records)
        try:
            sock = _connect(server)
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000\r\n\r\n{\"model\": ")
            time.sleep(0.2)
            sock.close()
            deadline = time.monotonic() + 10
            while not records.records and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.3)  # a second record, if any, would come right after the first
            assert httpx.post(f"{server.url}/v1/completions", json=OK).status_code == 200
        finally:
            for logger in watched:
                logger.removeHandler(records)
    assert len(records.records) == 1, [r.getMessage() for r in records.records]
    record = records.records[0]
    assert record.exc_info is None and "disconnected during POST /v1/completions" in record.getMessage()


# -- the playground page ----------------------------------------------------------------------------------

HOSTILE_NAME = "<!--<script>alert(1)</script>&amp;\"'</SCRIPT ><b>"


class _Page(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.scripts: list[str] = []
        self.tags: list[str] = []
        self.text: dict[str, str] = {}
        self._open: list[tuple[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self._open.append((tag, dict(attrs).get("id")))
        if tag == "script":
            self.scripts.append("")

    def handle_endtag(self, tag: str) -> None:
        if self._open and self._open[-1][0] == tag:
            self._open.pop()

    def handle_data(self, data: str) -> None:
        if not self._open:
            return
        tag, ident = self._open[-1]
        if tag == "script":
            self.scripts[-1] += data
        self.text[ident or tag] = self.text.get(ident or tag, "") + data


def _parsed(text: str) -> _Page:
    parsed = _Page()
    parsed.feed(text)
    parsed.close()
    return parsed


@pytest.mark.parametrize("model_id", [HOSTILE_NAME, "tiny"])
def test_the_playground_page_holds_any_model_name_as_data(model_id: str) -> None:
    parsed = _parsed(page(model_id=model_id))
    reference = _parsed(page(model_id="plain"))
    assert len(parsed.scripts) == 1 and parsed.tags == reference.tags  # no element added, none cut short
    assert "<b" not in parsed.tags[len(reference.tags):] and parsed.tags.count("b") == 0
    line = next(line for line in parsed.scripts[0].splitlines() if line.startswith("const MODEL = "))
    assert json.loads(line.removeprefix("const MODEL = ").removesuffix(";")) == model_id
    for escaped in ("<", ">", "&"):
        assert escaped not in line
    assert parsed.scripts[0].replace(line, "") == reference.scripts[0].replace(
        next(x for x in reference.scripts[0].splitlines() if x.startswith("const MODEL = ")), "")
    assert parsed.text["model"] == model_id
    assert parsed.text["title"] == f"specformer playground: {model_id}"


def test_the_served_page_escapes_the_model_name(model) -> None:
    with make_server(model, config={"model_id": HOSTILE_NAME}) as server:
        parsed = _parsed(httpx.get(f"{server.url}/").text)
    assert len(parsed.scripts) == 1 and parsed.text["model"] == HOSTILE_NAME
