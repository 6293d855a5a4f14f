"""A page cannot reach a loopback server by DNS rebinding: the ``Host`` must be a loopback name or an ``--allowed-host``.

After a rebinding, the browser sends the page's requests to 127.0.0.1 with the page's own
name in ``Host`` (and in ``Origin``, which then looks same-origin); these tests send what
such a page would and what legitimate clients send (loopback names, with or without a
port, and names the operator allowed).
"""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from specformer.cli.main import main
from specformer_serve import hosts

from .conftest import MODEL_ID, make_server

OK = {"model": MODEL_ID, "prompt": "ok", "max_tokens": 2, "temperature": 0}
JSON = {"Content-Type": "application/json"}


def _get(url: str, path: str, **headers: str) -> httpx.Response:
    return httpx.get(f"{url}{path}", headers=headers, timeout=30)


def _post(url: str, **headers: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", content=json.dumps(OK).encode(), headers={**JSON, **headers},
                      timeout=30)


def _refused(r: httpx.Response, host: str) -> None:
    assert r.status_code == 403, r.text
    assert "\n" not in r.text.strip()  # one line of JSON, in the server's error shape
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["code"] == "host_not_allowed", error
    assert repr(host) in error["message"] and "--allowed-host" in error["message"]
    assert r.headers["connection"] == "close"


@pytest.mark.parametrize("host", ["attacker.test", "attacker.test:8000", "ATTACKER.test", "localhost.attacker.test",
                                  "127.0.0.1.attacker.test", "user@127.0.0.1", ""])
def test_a_foreign_host_is_403_on_every_route_with_or_without_origin(server, host) -> None:
    page = f"http://{host}"
    for origin in ({}, {"Origin": page}):
        _refused(_post(server.url, Host=host, **origin), host)
        _refused(_get(server.url, "/v1/models", Host=host, **origin), host)
        _refused(_get(server.url, "/", Host=host, **origin), host)
        _refused(_get(server.url, "/health", Host=host, **origin), host)


@pytest.mark.parametrize("host, page", [
    ("localhost", "http://localhost"), ("LocalHost", "http://localhost"), ("localhost:8000", "http://localhost:8000"),
    ("127.0.0.1", "http://127.0.0.1"), ("127.0.0.1:1", "http://127.0.0.1:1"),
    ("127.12.0.3:65535", "http://127.12.0.3:65535"), ("[::1]", "http://[::1]"), ("[::1]:8000", "http://[::1]:8000")])
def test_loopback_names_with_or_without_a_port_are_served(server, host, page) -> None:
    assert _get(server.url, "/v1/models", Host=host).status_code == 200
    assert _post(server.url, Host=host).status_code == 200
    # The page the browser addressed by that name is the server's own: its Origin is accepted too.
    assert _post(server.url, Host=host, Origin=page).status_code == 200


def test_a_request_without_a_host_is_served(server) -> None:
    # HTTP/1.0 allows leaving Host out; a browser never does, so such a request is not a page's.
    with socket.create_connection((server.host, server.port), timeout=30) as conn:
        conn.sendall(b"GET /health HTTP/1.0\r\n\r\n")
        answer = b""
        while chunk := conn.recv(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200"), answer


def test_allowed_hosts_are_served_in_any_case(model) -> None:
    allowed = hosts.check_allowed(["Proxy.Example", "10.1.2.3", "[FD00::1]"])
    with make_server(model, config={"allowed_hosts": allowed}) as server:
        for host in ("proxy.example", "PROXY.example:8443", "10.1.2.3", "10.1.2.3:8000", "[fd00::1]:80",
                     "localhost:1"):
            assert _post(server.url, Host=host).status_code == 200, host
            assert _get(server.url, "/", Host=host).status_code == 200, host
        for host in ("attacker.test", "proxy.example.attacker.test", "10.1.2.4", "[fd00::2]"):
            _refused(_post(server.url, Host=host), host)


def test_a_server_on_another_address_checks_the_host_only_when_names_are_given(model) -> None:
    # Reached by names it cannot know (its LAN address, DNS names), so no check unless --allowed-host says which.
    with make_server(model, host="0.0.0.0") as server:
        url = f"http://127.0.0.1:{server.port}"
        assert _post(url, Host="box.lan").status_code == 200
    with make_server(model, host="0.0.0.0", config={"allowed_hosts": ("box.lan",)}) as server:
        url = f"http://127.0.0.1:{server.port}"
        assert _post(url, Host="BOX.lan:8000").status_code == 200
        assert _post(url).status_code == 200  # 127.0.0.1: loopback names stay served
        _refused(_post(url, Host="attacker.test"), "attacker.test")


@pytest.mark.parametrize("value", ["example.com:8000", "http://example.com", "example.com/path", "a@example.com",
                                   "[::1", "", " "])
def test_an_allowed_host_that_is_not_a_bare_name_is_refused(value) -> None:
    with pytest.raises(ValueError, match="is not a host name; give a bare name or address"):
        hosts.check_allowed([value])


def test_the_command_line_takes_repeated_allowed_hosts(capsys, checkpoint, monkeypatch) -> None:
    from specformer_serve import server as server_module

    seen = {}

    class Started:
        url = "http://127.0.0.1:1"

        def __init__(self, engine, config, **options) -> None:
            seen["allowed_hosts"] = config.allowed_hosts

        def run(self) -> None:
            pass

    monkeypatch.setattr(server_module, "Server", Started)
    assert main(["serve", str(checkpoint), "--threads", "1", "--allowed-host", "Box.LAN",
                 "--allowed-host", "::1"]) == 0
    assert seen["allowed_hosts"] == ("box.lan", "::1")
    code = main(["serve", str(checkpoint), "--allowed-host", "box.lan:8000"])
    assert code == 2 and "--allowed-host 'box.lan:8000' is not a host name" in capsys.readouterr().err
