"""A web page cannot spend the server's compute: POSTs must be JSON, and a browser's Origin must be the server's own.

A browser POSTs ``text/plain`` to any address without asking; these tests send what such a
page would (a foreign ``Origin``, a non-JSON content type) and what legitimate clients send
(the playground's same-origin fetch, curl and SDKs with no ``Origin`` at all).
"""

from __future__ import annotations

import json

import httpx
import pytest

from specformer.cli.main import main
from specformer_serve import origin

from .conftest import MODEL_ID, make_server

OK = {"model": MODEL_ID, "prompt": "ok", "max_tokens": 2, "temperature": 0}
CHAT = {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
JSON = {"Content-Type": "application/json"}


def _post(server, route: str, body: dict, **headers: str) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/{route}", content=json.dumps(body).encode(), headers=headers, timeout=30)


def _refused(r: httpx.Response, status: int, code: str) -> str:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["code"] == code, error
    return error["message"]


@pytest.mark.parametrize("route, body", [("completions", OK), ("chat/completions", CHAT)])
@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", "application/jsonx", "text/json"])
def test_a_body_not_sent_as_json_is_415(server, route, body, content_type) -> None:
    headers = {} if content_type is None else {"Content-Type": content_type}
    message = _refused(_post(server, route, body, **headers), 415, "unsupported_content_type")
    assert "Content-Type: application/json" in message and (content_type is None or repr(content_type) in message)
    assert _post(server, route, body, **JSON).status_code == 200


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8",
                                          "Application/JSON ;charset=UTF-8"])
def test_json_with_parameters_and_any_case_is_served(server, content_type) -> None:
    assert _post(server, "completions", OK, **{"Content-Type": content_type}).status_code == 200


@pytest.mark.parametrize("route, body", [("completions", OK), ("chat/completions", CHAT)])
@pytest.mark.parametrize("foreign", ["https://evil.example", "http://127.0.0.1:1", "null", "http://localhost",
                                     "file://", "garbage"])
def test_a_foreign_origin_is_403_even_with_json(server, route, body, foreign) -> None:
    message = _refused(_post(server, route, body, Origin=foreign, **JSON), 403, "origin_not_allowed")
    assert repr(foreign) in message and "--allow-origin" in message
    # The simple request a page can send without a preflight is refused as well.
    _refused(_post(server, route, body, Origin=foreign, **{"Content-Type": "text/plain"}), 403, "origin_not_allowed")


def test_the_servers_own_origin_and_no_origin_are_served(model) -> None:
    # served.example: a name the server answers to (a reverse proxy's), besides loopback ones (test_hosts.py)
    with make_server(model, config={"allowed_hosts": ("served.example",)}) as server:
        own = server.url  # http://127.0.0.1:PORT, the playground's origin; httpx sends Host: 127.0.0.1:PORT
        assert _post(server, "completions", OK, Origin=own, **JSON).status_code == 200
        assert _post(server, "chat/completions", CHAT, Origin=own.upper().replace("HTTP", "http"), **JSON).status_code == 200
        assert _post(server, "completions", OK, **JSON).status_code == 200  # curl, SDKs: no Origin
        # Same origin is judged against the Host the client addressed, default port included.
        assert _post(server, "completions", OK, Origin="http://served.example", Host="served.example", **JSON).status_code == 200
        assert _post(server, "completions", OK, Origin="http://served.example:80", Host="served.example",
                     **JSON).status_code == 200
        # Behind a TLS proxy the Host has no port, and the page's is https's own.
        assert _post(server, "completions", OK, Origin="https://served.example", Host="served.example",
                     **JSON).status_code == 200
        _refused(_post(server, "completions", OK, Origin="https://served.example", Host="served.example:8000", **JSON),
                 403, "origin_not_allowed")
        _refused(_post(server, "completions", OK, Origin="http://served.example.evil", Host="served.example", **JSON),
                 403, "origin_not_allowed")


def test_allowed_origins_are_served_and_get_cors_answers(model) -> None:
    allowed = origin.check_allowed(["https://App.example", "http://localhost:3000"])
    with make_server(model, config={"allow_origins": allowed}) as server:
        for page in ("https://app.example", "https://app.example:443", "http://localhost:3000"):
            r = _post(server, "completions", OK, Origin=page, **JSON)
            assert r.status_code == 200, r.text
            assert r.headers["access-control-allow-origin"] == page
        preflight = httpx.options(f"{server.url}/v1/chat/completions", headers={
            "Origin": "https://app.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type, authorization"})
        assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == "https://app.example"
        _refused(_post(server, "completions", OK, Origin="https://other.example", **JSON), 403, "origin_not_allowed")
        _refused(_post(server, "completions", OK, Origin="http://localhost:3001", **JSON), 403, "origin_not_allowed")
        assert _post(server, "completions", OK, Origin=server.url, **JSON).status_code == 200
    with make_server(model, config={"allow_origins": origin.check_allowed(["*"])}) as server:
        assert _post(server, "completions", OK, Origin="https://anyone.example", **JSON).status_code == 200
        # Any origin still posts JSON only.
        _refused(_post(server, "completions", OK, Origin="https://anyone.example", **{"Content-Type": "text/plain"}),
                 415, "unsupported_content_type")


def test_the_origin_is_checked_before_the_api_key(model) -> None:
    with make_server(model, api_key="k") as server:
        _refused(_post(server, "completions", OK, Origin="https://evil.example", Authorization="Bearer k", **JSON),
                 403, "origin_not_allowed")
        _refused(_post(server, "completions", OK, **JSON), 401, "invalid_api_key")
        assert _post(server, "completions", OK, Authorization="Bearer k", Origin=server.url, **JSON).status_code == 200


@pytest.mark.parametrize("value", ["example.com", "https://example.com/path", "ftp://example.com",
                                   "https://user@example.com", "https://example.com:99999", "https://", ""])
def test_an_allow_origin_that_is_not_an_origin_is_refused(value) -> None:
    with pytest.raises(ValueError, match="is not an origin; give scheme://host"):
        origin.check_allowed([value])


def test_the_command_line_takes_repeated_allow_origins(capsys, checkpoint, monkeypatch) -> None:
    from specformer_serve import server as server_module

    seen = {}

    class Started:
        url = "http://127.0.0.1:1"

        def __init__(self, engine, config, **options) -> None:
            seen["allow_origins"] = config.allow_origins

        def run(self) -> None:
            pass

    monkeypatch.setattr(server_module, "Server", Started)
    assert main(["serve", str(checkpoint), "--threads", "1", "--allow-origin", "https://a.example",
                 "--allow-origin", "http://B.example:8080/"]) == 0
    assert seen["allow_origins"] == ("https://a.example:443", "http://b.example:8080")
    code = main(["serve", str(checkpoint), "--allow-origin", "a.example"])
    assert code == 2 and "--allow-origin 'a.example' is not an origin" in capsys.readouterr().err
