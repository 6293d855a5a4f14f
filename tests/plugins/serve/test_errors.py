"""Bad requests get 4xx OpenAI-style errors, disconnects free their slots, the API key is checked; the server goes on."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import httpx
import pytest
import specformer

from .conftest import MODEL_ID, make_server, served_spec

OK = {"model": MODEL_ID, "prompt": "ok", "max_tokens": 3, "temperature": 0}
CHAT = {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}

#: (route, body, status, param, words the message must contain)
BAD: list[tuple[str, Any, int, str | None, str]] = [
    ("completions", b"{", 400, None, "not valid JSON"),
    ("completions", b"\xff\xfe", 400, None, "not valid JSON"),
    ("completions", [1, 2], 400, None, "must be a JSON object"),
    ("completions", {**OK, "foo": 1}, 400, "foo", "unknown field 'foo'"),
    ("completions", {**OK, "best_of": 2}, 400, "best_of", "not supported"),
    ("completions", {**OK, "logit_bias": {"259": 5}}, 400, "logit_bias", "\"0\" to \"258\""),
    ("completions", {**OK, "logit_bias": {"-1": 5}}, 400, "logit_bias", "not a token id"),
    ("completions", {**OK, "logit_bias": {"a": 5}}, 400, "logit_bias", "not a token id"),
    ("completions", {**OK, "logit_bias": {"5": 101}}, 400, "logit_bias.5", "less than or equal to 100"),
    ("completions", {**OK, "logit_bias": {"5": "1"}}, 400, "logit_bias.5", "valid"),
    ("completions", {**OK, "prompt": "x" * 97, "max_tokens": 0, "echo": True}, 400, "prompt", "context is 96"),
    ("completions", {k: v for k, v in OK.items() if k != "prompt"}, 400, "prompt", "Field required"),
    ("completions", {**OK, "max_tokens": 0}, 400, "max_tokens", "only with echo: true"),
    ("completions", {**OK, "max_tokens": -1}, 400, "max_tokens", "greater than or equal to 0"),
    ("completions", {**OK, "max_tokens": "5"}, 400, "max_tokens", "valid integer"),
    ("completions", {**OK, "temperature": 2.5}, 400, "temperature", "less than or equal to 2"),
    ("completions", {**OK, "top_p": 0}, 400, "top_p", "greater than 0"),
    ("completions", {**OK, "n": 0}, 400, "n", "greater than or equal to 1"),
    ("completions", {**OK, "stream": "yes"}, 400, "stream", "valid boolean"),
    ("completions", {**OK, "presence_penalty": 3}, 400, "presence_penalty", "less than or equal to 2"),
    ("completions", {**OK, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", "at most 4"),
    ("completions", {**OK, "stop": [""]}, 400, "stop", "must not be empty"),
    ("completions", {**OK, "seed": 2**70}, 400, "seed", "less than"),
    ("completions", {**OK, "seed": 2**64 - 1, "n": 2}, 400, "seed", "below 2**64"),
    ("completions", {**OK, "prompt": "x" * 200}, 400, "prompt", "context"),
    ("completions", {**OK, "prompt": "x" * 50, "max_tokens": 80}, 400, "max_tokens", "max_tokens <= 46"),
    ("completions", {**OK, "prompt": ""}, 400, "prompt", "empty"),
    ("completions", {**OK, "prompt": [5, 999]}, 400, "prompt", "token id 999 is outside the vocabulary"),
    ("completions", {**OK, "prompt": []}, 400, "prompt", "empty list"),
    ("completions", b'{"model": "tiny", "prompt": "a\\ud800"}', 400, "prompt", "not valid Unicode"),
    ("completions", b"[" * 100000, 400, None, "not valid JSON"),
    ("completions", {**OK, "model": "gpt-4"}, 404, "model", "does not exist"),
    ("completions", {**OK, "n": 16, "prompt": ["a", "b", "c", "d", "e"]}, 400, "n", "at most 64"),
    ("chat/completions", {**CHAT, "messages": []}, 400, "messages", "at least 1 item"),
    ("chat/completions", {**CHAT, "messages": [{"role": "tool", "content": "x"}]}, 400, "messages.0.role", "Input should be"),
    ("chat/completions", {**CHAT, "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, 400,
     "tools", "tool calling is not supported"),
    ("chat/completions", {**CHAT, "tools": [{"type": "web"}]}, 400, "tools.0.type", "Input should be"),
    ("chat/completions", {**CHAT, "tool_choice": "required"}, 400, "tool_choice", "calls no tools"),
    ("chat/completions", {**CHAT, "tool_choice": {"type": "function", "function": {"name": "f"}}}, 400, "tool_choice",
     "calls no tools"),
    ("chat/completions", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, 400,
     "response_format.json_schema.schema", "Field required"),
    ("chat/completions", {**CHAT, "response_format": {"type": "json_schema",
                                                      "json_schema": {"name": "x", "schema": {"type": "frob"}}}}, 400,
     "response_format.json_schema.schema", "the schema cannot be used"),
    ("chat/completions", {**CHAT, "response_format": {"type": "yaml"}}, 400, "response_format.type", "Input should be"),
    ("chat/completions", {**CHAT, "reasoning_effort": "extreme"}, 400, "reasoning_effort", "Input should be"),
    ("chat/completions", {**CHAT, "functions": []}, 400, "functions", "not supported"),
    ("chat/completions", {**CHAT, "messages": [{"role": "user", "content": None}]}, 400, "messages.0",
     "only an assistant message may have content null"),
    ("chat/completions", {**CHAT, "messages": [{"role": "user"}]}, 400, "messages.0", "needs content"),
    ("chat/completions", {**CHAT, "max_completion_tokens": 3}, 400, None, "not both"),
    ("chat/completions", {**CHAT, "top_logprobs": 2}, 400, None, "needs logprobs"),
    ("chat/completions", {**CHAT, "messages": [{"role": "user", "content": "x" * 300}]}, 400, "prompt", "context"),
]


@pytest.mark.parametrize("route, body, status, param, words", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_a_bad_request_is_a_4xx_openai_error_and_the_server_goes_on(server, route, body, status, param, words) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(f"{server.url}/v1/{route}", content=content, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert isinstance(error["code"], str) and error["code"], error  # a client's error always has a code
    assert words in error["message"], error["message"]
    assert error["param"] == param
    again = httpx.post(f"{server.url}/v1/completions", json=OK)
    assert again.status_code == 200 and again.json()["choices"][0]["finish_reason"] in ("length", "stop")


#: (route, body, code): what kind of mistake each refusal was, in OpenAI's words where OpenAI has them.
CODES: list[tuple[str, Any, str]] = [
    ("completions", {**OK, "reasoning_level": 1}, "unknown_parameter"),
    ("chat/completions", {**CHAT, "best_of": 2}, "unknown_parameter"),
    ("completions", {**OK, "suffix": "x"}, "unsupported_parameter"),
    ("chat/completions", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "missing_required_parameter"),
    ("chat/completions", {**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]}, "unsupported_value"),
    ("completions", {k: v for k, v in OK.items() if k != "prompt"}, "missing_required_parameter"),
    ("completions", {**OK, "max_tokens": "5"}, "invalid_type"),
    ("chat/completions", {**CHAT, "messages": [{"role": "user", "content": None}]}, "invalid_value"),
    ("completions", {**OK, "temperature": 2.5}, "invalid_value"),
    ("completions", {**OK, "logit_bias": {"259": 1}}, "invalid_value"),
    ("completions", [1], "invalid_type"),
    ("completions", b"{", "invalid_json"),
    ("completions", {**OK, "model": "gpt-4"}, "model_not_found"),
    ("completions", {**OK, "prompt": "x" * 200}, "context_length_exceeded"),
]


@pytest.mark.parametrize("route, body, code", CODES, ids=[c[2] + f"-{i}" for i, c in enumerate(CODES)])
def test_each_refusal_names_its_kind_in_the_code(server, route, body, code) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(f"{server.url}/v1/{route}", content=content, headers={"Content-Type": "application/json"})
    assert r.status_code in (400, 404), r.text
    assert r.json()["error"]["code"] == code, r.json()


def test_unknown_routes_and_methods(server) -> None:
    r = httpx.get(f"{server.url}/v1/engines")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    assert "POST /v1/completions" in r.json()["error"]["message"]
    r = httpx.get(f"{server.url}/v1/completions")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    assert httpx.get(f"{server.url}/v1/models").status_code == 200


def test_the_api_key_is_required_when_set(model) -> None:
    with make_server(model, api_key="s3cret") as server:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            r = httpx.post(f"{server.url}/v1/completions", json=OK, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", headers
            assert httpx.get(f"{server.url}/v1/models", headers=headers).status_code == 401
        good = {"Authorization": "Bearer s3cret"}
        assert httpx.post(f"{server.url}/v1/completions", json=OK, headers=good).status_code == 200
        assert httpx.get(f"{server.url}/v1/models", headers=good).status_code == 200
        assert httpx.get(f"{server.url}/").status_code == 200  # the page itself; it sends the key it is given


@pytest.fixture(scope="module")
def long_server():
    """A model with a long context and no end-of-text stop, so a request runs long enough to walk away from."""
    model = specformer.build(served_spec(context_length=4096), seed=0).eval()
    with make_server(model, eos=False, num_blocks=1024, block_size=8) as server:
        yield server


def _wait_idle(server, timeout: float = 30) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while True:
        stats = httpx.get(f"{server.url}/v1/stats").json()
        if stats["running"] == 0 and stats["waiting"] == 0:
            return stats
        assert time.monotonic() < deadline, f"the request is still running: {stats}"
        time.sleep(0.05)


def test_a_client_leaving_a_stream_frees_its_slot(long_server) -> None:
    before = httpx.get(f"{long_server.url}/v1/stats").json()
    body = {"model": MODEL_ID, "prompt": "go", "max_tokens": 4000, "stream": True}
    with httpx.stream("POST", f"{long_server.url}/v1/completions", json=body) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
    stats = _wait_idle(long_server)
    assert stats["ended_cancelled"] == before["ended_cancelled"] + 1
    assert stats["free_blocks"] == stats["total_blocks"]
    assert httpx.post(f"{long_server.url}/v1/completions", json={**body, "stream": False, "max_tokens": 3}).status_code == 200


def test_a_client_leaving_before_the_answer_frees_its_slot(long_server) -> None:
    before = httpx.get(f"{long_server.url}/v1/stats").json()
    body = json.dumps({"model": MODEL_ID, "prompt": "go", "max_tokens": 4000}).encode()
    with socket.create_connection((long_server.host, long_server.port)) as raw:
        raw.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        deadline = time.monotonic() + 30
        while httpx.get(f"{long_server.url}/v1/stats").json()["running"] == 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    stats = _wait_idle(long_server)
    assert stats["ended_cancelled"] == before["ended_cancelled"] + 1
    assert stats["free_blocks"] == stats["total_blocks"]


def test_random_bad_bodies_never_get_a_server_error(server) -> None:
    """Valid requests with a field or two replaced by a value of any JSON type: an answer or a 4xx, never a 5xx."""
    _fuzz(server, count=15, seed=0)


@pytest.mark.slow
def test_many_random_bad_bodies_never_get_a_server_error(server) -> None:
    _fuzz(server, count=400, seed=1)


def _fuzz(server, *, count: int, seed: int) -> None:
    import random

    rng = random.Random(seed)
    values = [None, True, -1, 0, 1, 3, 2**80, -(2**70), 1e308, -0.5, float("nan"), float("inf"), "", "x", "tiny",
              [], [1, "a"], [[1, 2], [3]], ["a", "b"], {}, {"include_usage": True}, {"role": "user"}, [{"role": "user"}],
              [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], [{"role": "user", "content": 5}]]
    fields = sorted({*OK, *CHAT, "n", "stop", "seed", "top_p", "stream", "stream_options", "logprobs", "top_logprobs",
                     "presence_penalty", "frequency_penalty", "max_completion_tokens", "return_token_ids", "prompt"})
    statuses = set()
    for _ in range(count):
        route, base = rng.choice([("completions", OK), ("chat/completions", CHAT)])
        body = {**base, rng.choice(fields): rng.choice(values)}
        if rng.random() < 0.3:
            body[rng.choice(fields)] = rng.choice(values)
        r = httpx.post(f"{server.url}/v1/{route}", content=json.dumps(body).encode(), timeout=60,
                       headers={"Content-Type": "application/json"})
        statuses.add(r.status_code)
        assert r.status_code in (200, 400, 404), (body, r.status_code, r.text)
        if r.status_code != 200:
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert 400 in statuses and (count < 100 or 200 in statuses)
    assert httpx.post(f"{server.url}/v1/completions", json=OK).status_code == 200
    stats = httpx.get(f"{server.url}/v1/stats").json()
    assert stats["ended_error"] == 0


def test_without_max_tokens_a_chat_gets_what_the_cache_can_hold(model) -> None:
    with make_server(model, eos=False, num_blocks=8, block_size=4) as small:  # 32 tokens of cache, context 96
        body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}], "return_token_ids": True}
        r = httpx.post(f"{small.url}/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert len(choice["prompt_token_ids"]) + len(choice["token_ids"]) == 32
        assert choice["finish_reason"] == "length"
        too_long = {**body, "max_tokens": 40}
        r = httpx.post(f"{small.url}/v1/chat/completions", json=too_long)
        assert r.status_code == 400 and "whole KV cache holds (32 tokens" in r.json()["error"]["message"]
