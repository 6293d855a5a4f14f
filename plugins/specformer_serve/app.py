"""The HTTP side: OpenAI's routes on Starlette, server-sent events, errors, the API key.

Routes: ``GET /`` (the playground page) and ``GET /health`` (liveness) are public; ``GET
/v1/models``, ``GET /v1/models/{id}``, ``GET /v1/stats`` (the engine's counters), ``POST
/v1/completions`` and ``POST /v1/chat/completions`` need the API key when the server has
one. A handler checks the request (:mod:`.protocol`), turns it into one engine request
per choice (a completion with ``echo`` and ``logprobs`` also asks for the prompt's
logprobs, which the prefill reports), and waits on an asyncio queue the engine thread
fills. Every failure a client can cause is an OpenAI-style JSON error with a 4xx status
and a ``code``; an unexpected one is a 500 with the same shape, and the server goes on.
A client that goes away (closed stream, dropped connection) cancels its choices, which
frees their blocks at the engine's next turn.

A POST must say ``Content-Type: application/json`` (415 otherwise), and one that carries an
``Origin`` must come from the server's own address or an ``--allow-origin`` (403
otherwise), so a web page cannot spend a keyless server's compute (:mod:`.origin`). A server
on a loopback address answers only requests addressed (``Host``) to a loopback name or an
``--allowed-host``, on every route, so a page cannot reach it by DNS rebinding (403
otherwise, :mod:`.hosts`).

Nothing a client sends can hold the event loop: the body must arrive within
``body_timeout`` seconds and ``max_body_bytes``; a chat request's message count is checked
before anything else is done with it; parsing the JSON, rendering the chat template (itself
bounded in time and size) and tokenizing run on a small pool of worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from specformer.errors import UserError
from specformer_generate import checked_seed
from specformer_serve import hosts as host_rules
from specformer_serve import limits
from specformer_serve import origin as origin_rules
from specformer_serve.chat_template import TemplateError, TurnEnd
from specformer_serve.choices import Choice, decode
from specformer_serve.engine import Engine, SequenceRequest
from specformer_serve.events import Poster
from specformer_serve.playground import page
from specformer_serve.protocol import (ChatRequest, CompletionRequest, RequestError, bind_sampler, parse,
                                       request_sampler)

log = logging.getLogger("specformer.serve")

#: Worker threads that parse, render and tokenize requests, off the event loop.
PREPARE_THREADS = 4
#: The most choices (prompts x n) one request may ask for.
MAX_CHOICES = 64
#: How often a waiting handler looks whether its client is still there (seconds).
DISCONNECT_POLL = 0.2


@dataclass
class ServeConfig:
    """What the routes need besides the engine."""

    model_id: str
    tokenizer: Any
    render_chat: Callable[[list[dict[str, Any]]], str]
    eos: frozenset[int]
    turn_end: TurnEnd = TurnEnd()  # where a chat reply ends besides eos: the template's end-of-turn marker
    api_key: str | None = None
    max_body_bytes: int = limits.MAX_BODY_BYTES
    body_timeout: float = limits.BODY_TIMEOUT
    max_messages: int = limits.MAX_MESSAGES
    #: Origins besides the server's own whose pages may POST (normalized, ``*`` for any): ``--allow-origin``.
    allow_origins: tuple[str, ...] = ()
    #: Host names besides loopback ones that requests may address (lower case): ``--allowed-host``.
    allowed_hosts: tuple[str, ...] = ()


_T = TypeVar("_T")


def create_app(engine: Engine, config: ServeConfig, *, bound: str) -> Starlette:
    """The ASGI application for a server listening on the address ``bound``; the engine must be started (and
    stopped) by the caller."""
    created = int(time.time())
    # Its own pool, not the loop's default one: a burst of slow templates waits here, and
    # nothing else (Starlette's own thread use included) waits behind it.
    workers = ThreadPoolExecutor(max_workers=PREPARE_THREADS, thread_name_prefix="specformer-serve-prepare")

    async def off_loop(work: Callable[[], _T]) -> _T:
        return await asyncio.get_running_loop().run_in_executor(workers, work)

    async def read_json(request: Request) -> Any:
        data = await _body(request, config)
        return await off_loop(lambda: _parse_json(data))

    async def playground(request: Request) -> Response:
        return HTMLResponse(page(model_id=config.model_id))

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def stats(request: Request) -> Response:
        _authorize(request, config)
        return JSONResponse(engine.stats())

    def model_entry() -> dict[str, Any]:
        return {"id": config.model_id, "object": "model", "created": created, "owned_by": "specformer",
                "context_length": engine.context_length}

    async def models(request: Request) -> Response:
        _authorize(request, config)
        return JSONResponse({"object": "list", "data": [model_entry()]})

    async def model(request: Request) -> Response:
        _authorize(request, config)
        _check_model(request.path_params["model_id"], config)
        return JSONResponse(model_entry())

    async def completions(request: Request) -> Response:
        _check_post(request, config)
        body: CompletionRequest = parse(CompletionRequest, await read_json(request), "completions")
        _check_model(body.model, config)
        prompts = await off_loop(lambda: [_prompt_ids(p, config.tokenizer, engine.vocab_size, "prompt")
                                          for p in body.prompts()])
        return await _respond(request, engine, config, body, prompts, off_loop=off_loop, chat=False,
                              max_tokens=body.max_tokens, logprobs=body.logprobs, echo=body.echo)

    async def chat(request: Request) -> Response:
        _check_post(request, config)
        data = await read_json(request)
        _check_message_count(data, config)
        body: ChatRequest = parse(ChatRequest, data, "chat")
        _check_model(body.model, config)
        messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in body.messages]
        try:
            budget, logprobs = body.token_budget(), body.logprob_count()
        except ValueError as exc:
            raise RequestError(str(exc)) from None
        prompt = await off_loop(lambda: _chat_prompt(messages, config, engine.vocab_size))
        return await _respond(request, engine, config, body, [prompt], off_loop=off_loop, chat=True,
                              max_tokens=budget, logprobs=logprobs, turn_end=config.turn_end)

    routes = [
        Route("/", playground, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/v1/stats", stats, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", model, methods=["GET"]),  # an id may hold a slash (org/name)
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
    ]
    handlers = {RequestError: _request_error, HTTPException: _http_error, ClientDisconnect: _client_gone,
                Exception: _server_error}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            workers.shutdown(wait=False, cancel_futures=True)

    middleware = [Middleware(_AnsweredByTheHttpLayer)]
    if host_rules.applies(bound, config.allowed_hosts):  # before CORS: a rebound page gets no preflight either
        middleware.append(Middleware(_AddressedHostsOnly, allowed=config.allowed_hosts))
    if config.allow_origins:  # pages on an allowed origin need CORS answers to read what they asked for
        middleware.append(Middleware(_AllowedOriginsCors, allow_origins=list(config.allow_origins),
                                     allow_methods=["GET", "POST"], allow_headers=["Authorization", "Content-Type"]))
    return Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan,  # type: ignore[arg-type]
                     middleware=middleware)


class _AllowedOriginsCors(CORSMiddleware):
    """Starlette's CORS answers (preflight included), matching origins as the Origin check does (case, default port)."""

    def is_allowed_origin(self, origin: str) -> bool:
        return self.allow_all_origins or origin_rules.normalize(origin) in self.allow_origins


class _AddressedHostsOnly:
    """Answer 403 to a request whose ``Host`` is neither a loopback name nor an ``--allowed-host`` (:mod:`.hosts`).

    A middleware, not a route check, so that every route is covered, the playground and
    ``GET /v1/models`` as well as the POSTs: a rebound page could read those answers too.
    """

    def __init__(self, app: Any, *, allowed: tuple[str, ...]) -> None:
        self.app, self.allowed = app, allowed

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            host = next((value.decode("latin-1") for key, value in scope["headers"] if key == b"host"), None)
            if not host_rules.served(host, allowed=self.allowed):
                error = RequestError(f"requests addressed to the host {host!r} are not served: only loopback names "
                                     f"(localhost, 127.0.0.1, [::1]) are, and names given with --allowed-host",
                                     status=403, code="host_not_allowed", close=True)
                response = JSONResponse(error.body(), status_code=error.status, headers={"Connection": "close"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _AnsweredByTheHttpLayer:
    """Drop a response the HTTP layer can no longer send, with one log line instead of two tracebacks.

    A request whose body turns out malformed (a broken chunk) is answered 400 by uvicorn's
    h11 layer itself, while the route may already be producing its own response; sending
    that one then raises h11's ``LocalProtocolError``. Nothing is wrong with the server, and
    the connection is closing, so the rest of the response goes nowhere (found by
    tests/fuzz/test_fuzz_http.py).
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # late: the HTTP stack is an optional extra
        from h11 import LocalProtocolError  # uvicorn's HTTP/1.1 implementation, which server.py chooses

        dropped = False

        async def send_while_open(message: Any) -> None:
            nonlocal dropped
            if dropped:
                return
            try:
                await send(message)
            except LocalProtocolError as exc:
                dropped = True
                log.warning("%s %s: the response was dropped: the HTTP layer had already answered a malformed "
                            "request (%s)", scope.get("method"), scope.get("path"), exc)
                # Return only once uvicorn has seen the connection close (it has closed it already), so it
                # counts the response as abandoned, not as one the app left unfinished (an error line).
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(_disconnected(receive), timeout=5.0)

        await self.app(scope, receive, send_while_open)


async def _disconnected(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _chat_prompt(messages: list[dict[str, Any]], config: ServeConfig, vocab_size: int) -> list[int]:
    """The prompt's token ids: the messages rendered with the chat template (a worker thread's job), tokenized."""
    try:
        text = config.render_chat(messages)
    except TemplateError as exc:
        raise RequestError(f"{exc} (the server's chat template could not render these messages)",
                           param="messages") from None
    return _prompt_ids(text, config.tokenizer, vocab_size, "messages")


# -- one request ----------------------------------------------------------------------------------


async def _respond(request: Request, engine: Engine, config: ServeConfig, body: Any, prompts: list[list[int]], *,
                   off_loop: Callable[[Callable[[], Any]], Awaitable[Any]], chat: bool, max_tokens: int | None,
                   logprobs: int | None, echo: bool = False,
                   turn_end: TurnEnd = TurnEnd()) -> Response:
    """Run the request's choices; ``echo`` (completions): each choice's text and logprobs start with its prompt's.

    ``off_loop`` runs work on the app's worker threads: building the sampler (a ``response_format`` schema is
    compiled then) and binding it to each choice's prompt."""
    try:
        # A chat reply also ends at its template's end-of-turn marker: a token id (with eos), or text (a stop string).
        stops = body.stop_strings()
        stops += [s for s in turn_end.strings if s not in stops]
        seed = checked_seed(body.seed)
    except ValueError as exc:
        raise RequestError(str(exc), param="stop" if "stop" in str(exc) else "seed") from None
    if seed is not None and seed + body.n - 1 >= 2**64:  # choice j is seeded with seed + j
        raise RequestError(f"seed: with n={body.n} the seeds run up to seed + {body.n - 1}, which must be below 2**64",
                           param="seed")
    if len(prompts) * body.n > MAX_CHOICES:
        raise RequestError(f"{len(prompts)} prompt(s) x n={body.n} is {len(prompts) * body.n} choices; at most "
                           f"{MAX_CHOICES} per request", param="n")
    # Built once, off the event loop (a response_format schema is compiled here): a bad logit_bias or schema is
    # refused before anything runs. Each choice gets it bound to its prompt (a constraint's own matcher state).
    sampler = await off_loop(lambda: request_sampler(body, vocab_size=engine.vocab_size))
    for i, prompt in enumerate(prompts):
        budget = max_tokens if max_tokens is not None else engine.room_after(len(prompt))
        try:
            engine.check(len(prompt), budget if echo else max(budget, 1))
        except ValueError as exc:
            raise RequestError(str(exc), param="max_tokens" if "max_tokens" in str(exc) else "prompt",
                               code="context_length_exceeded") from None
    eos = config.eos | turn_end.ids

    def bound_samplers() -> list[Any]:
        return [bind_sampler(sampler, body, tokenizer=config.tokenizer, vocab_size=engine.vocab_size, eos=eos,
                             prompt_tokens=len(prompt)) for prompt in prompts for _ in range(body.n)]

    samplers = await off_loop(bound_samplers)
    queue: asyncio.Queue = asyncio.Queue()
    post = Poster.for_app(request, engine)
    choices: list[Choice] = []
    for i, prompt in enumerate(prompts):
        budget = max_tokens if max_tokens is not None else engine.room_after(len(prompt))
        for j in range(body.n):
            index = len(choices)
            choice = Choice(index=index, prompt=prompt, tokenizer=config.tokenizer, stops=stops,
                            hidden=turn_end.ids)
            choices.append(choice)

            def emit(event: Any, index: int = index) -> None:
                post(queue, (index, event))

            # Choice j of a prompt is that prompt alone with seed + j (so n > 1 gives different draws).
            request_seed = None if seed is None else seed + j
            choice.handle = engine.submit(SequenceRequest(
                prompt=prompt, max_new_tokens=budget, sampler=samplers[index],
                emit=emit, seed=request_seed, eos=eos,
                logprobs=logprobs, prompt_logprobs=logprobs if echo else None,
            ))
    meta = _Meta(id=("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24], created=int(time.time()),
                 model=config.model_id, chat=chat, token_ids=body.return_token_ids, echo=echo,
                 scores_prompt=echo and logprobs is not None)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        events = _stream(request, queue, choices, meta, config.tokenizer, include_usage)
        return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    try:
        while not all(c.done for c in choices):
            if not await _next_event(request, queue, choices):
                return Response(status_code=499)  # the client is gone; nobody reads this
    finally:
        _cancel_unfinished(choices)
    failed = [c for c in choices if c.error]
    if failed:
        raise RequestError(f"generation failed: {failed[0].error}", status=500, type="server_error")
    return JSONResponse({
        "id": meta.id, "object": "chat.completion" if chat else "text_completion", "created": meta.created,
        "model": meta.model, "choices": [_choice_body(c, meta, config.tokenizer) for c in choices],
        "usage": _usage(choices),
    })


@dataclass
class _Meta:
    id: str
    created: int
    model: str
    chat: bool
    token_ids: bool
    echo: bool = False
    scores_prompt: bool = False  # echo with logprobs: the prompt's logprobs come from the prefill


async def _next_event(request: Request, queue: asyncio.Queue, choices: list[Choice]) -> bool:
    """Wait for the next engine event and hand it to its choice; False when the client disconnected.

    Whether the client is still there is looked at every ``DISCONNECT_POLL`` seconds, whether
    or not tokens keep coming (a busy stream would otherwise never look).
    """
    state = request.scope.setdefault("specformer.serve", {"checked": time.monotonic()})
    while True:
        now = time.monotonic()
        if now - state["checked"] >= DISCONNECT_POLL:
            state["checked"] = now
            if await request.is_disconnected():
                return False
        try:
            index, event = await asyncio.wait_for(queue.get(), timeout=DISCONNECT_POLL)
        except asyncio.TimeoutError:
            continue
        choices[index].feed(event)
        while not queue.empty():  # whatever else has arrived: one wake-up, one write
            index, event = queue.get_nowait()
            choices[index].feed(event)
        return True


async def _stream(request: Request, queue: asyncio.Queue, choices: list[Choice], meta: _Meta, tokenizer: Any,
                  include_usage: bool) -> AsyncIterator[str]:
    try:
        if meta.chat:
            for c in choices:  # the first chunk of a chat stream names the role
                yield _sse(_chunk(meta, c.index, {"role": "assistant", "content": ""}, None))
        while not all(c.done for c in choices):
            if not await _next_event(request, queue, choices):
                return
            out = []
            for c in choices:
                if c.error:
                    yield _sse({"error": {"message": f"generation failed: {c.error}", "type": "server_error",
                                          "param": None, "code": None}})
                    return
                if meta.echo and not c.echoed:
                    if meta.scores_prompt and c.prompt_logprobs is None and not c.done:
                        continue  # the prompt's chunk carries its logprobs: wait for the prefill
                    c.echoed = True
                    echoed = {"logprobs": _logprobs_body(c.prompt_logprobs, tokenizer, False)} if c.prompt_logprobs else {}
                    out.append(_sse(_chunk(meta, c.index, decode(tokenizer, c.prompt), None, **echoed)))
                piece = c.delta()
                new_logprobs = c.logprobs[c.streamed_logprobs:]
                new_tokens = c.tokens[c.streamed_tokens:] if meta.token_ids else []
                finish = c.finish_reason if c.done and not c.ended else None
                if not (piece or new_logprobs or new_tokens or finish):
                    continue
                c.streamed_logprobs, c.streamed_tokens = len(c.logprobs), len(c.tokens)
                c.ended = c.ended or finish is not None
                extra: dict[str, Any] = {}
                if new_logprobs:
                    extra["logprobs"] = _logprobs_body(new_logprobs, tokenizer, meta.chat)
                if new_tokens:
                    extra["token_ids"] = new_tokens  # the ids of this chunk's new tokens (vLLM's streaming form)
                content = {"content": piece} if meta.chat else piece
                out.append(_sse(_chunk(meta, c.index, content, finish, **extra)))
            if out:
                yield "".join(out)  # one write for every choice's chunk
        if include_usage:
            yield _sse({"id": meta.id, "object": _chunk_object(meta), "created": meta.created, "model": meta.model,
                        "choices": [], "usage": _usage(choices)})
        yield "data: [DONE]\n\n"
    finally:
        _cancel_unfinished(choices)


def _cancel_unfinished(choices: list[Choice]) -> None:
    for c in choices:
        if not c.done and c.handle is not None:
            c.handle.cancel()


# -- response bodies ------------------------------------------------------------------------------


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def _chunk_object(meta: _Meta) -> str:
    return "chat.completion.chunk" if meta.chat else "text_completion"


def _chunk(meta: _Meta, index: int, content: Any, finish: str | None, **extra: Any) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": index, "logprobs": None, "finish_reason": finish}
    if meta.chat:
        choice["delta"] = content
    else:
        choice["text"] = content
    choice.update(extra)
    return {"id": meta.id, "object": _chunk_object(meta), "created": meta.created, "model": meta.model,
            "choices": [choice]}


def _choice_body(c: Choice, meta: _Meta, tokenizer: Any) -> dict[str, Any]:
    scored = [*(c.prompt_logprobs or []), *c.logprobs] if meta.echo else c.logprobs
    body: dict[str, Any] = {"index": c.index, "finish_reason": c.finish_reason,
                            "logprobs": _logprobs_body(scored, tokenizer, meta.chat) if scored else None}
    if meta.chat:
        body["message"] = {"role": "assistant", "content": c.text}
    else:
        body["text"] = decode(tokenizer, c.prompt) + c.text if meta.echo else c.text
    if meta.token_ids:
        body["prompt_token_ids"] = c.prompt
        body["token_ids"] = c.tokens
    return body


def _logprobs_body(events: list[Any], tokenizer: Any, chat: bool) -> dict[str, Any]:
    def text(token: int) -> str:
        return decode(tokenizer, [token])

    if chat:
        return {"content": [
            {"token": text(e.token), "logprob": e.logprob, "bytes": list(text(e.token).encode()),
             "top_logprobs": [{"token": text(t), "logprob": lp, "bytes": list(text(t).encode())} for t, lp in e.top]}
            for e in events
        ]}
    offsets, at = [], 0
    for e in events:
        offsets.append(at)
        at += len(text(e.token))
    # An echoed prompt's first token has no logprob, and no alternatives: null for both (OpenAI's form).
    return {"tokens": [text(e.token) for e in events], "token_logprobs": [e.logprob for e in events],
            "top_logprobs": [None if e.logprob is None else _by_text(e.top, text) for e in events],
            "text_offset": offsets}


def _by_text(top: Any, text: Callable[[int], str]) -> dict[str, float]:
    """Alternatives keyed by their text (OpenAI's completions format); tokens that decode alike keep the likeliest."""
    keyed: dict[str, float] = {}
    for token, logprob in top:  # likeliest first
        keyed.setdefault(text(token), logprob)
    return keyed


def _usage(choices: list[Choice]) -> dict[str, int]:
    prompt = sum(len(p) for p in {id(c.prompt): c.prompt for c in choices}.values())
    completion = sum(len(c.tokens) for c in choices)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


# -- checks ---------------------------------------------------------------------------------------


def _check_post(request: Request, config: ServeConfig) -> None:
    """A POST route's checks before its body is read: the page it came from, the API key, the content type."""
    origin = request.headers.get("origin")
    if origin is not None and not origin_rules.same_or_allowed(origin, host=request.headers.get("host", ""),
                                                               allowed=config.allow_origins):
        raise RequestError(f"requests from the web page origin {origin!r} are not allowed: only pages served by this "
                           f"server are, and origins given with --allow-origin", status=403, code="origin_not_allowed",
                           close=True)
    _authorize(request, config)
    content_type = request.headers.get("content-type")
    if not origin_rules.is_json(content_type):
        raise RequestError(f"the request body must be sent with 'Content-Type: application/json', got "
                           f"{content_type!r}" if content_type is not None else
                           "the request body must be sent with 'Content-Type: application/json', got no Content-Type",
                           status=415, code="unsupported_content_type", close=True)


def _authorize(request: Request, config: ServeConfig) -> None:
    if config.api_key is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), config.api_key.encode()):
        raise RequestError("missing or wrong API key: send the header 'Authorization: Bearer <key>' with the key "
                           "the server was started with (--api-key)", status=401, code="invalid_api_key")


async def _body(request: Request, config: ServeConfig) -> bytes:
    """The request body, refused (and the connection closed) when too large or not all there within the deadline."""
    def too_large() -> RequestError:
        return RequestError(f"the request body is larger than {config.max_body_bytes:,} bytes (--max-body-bytes)",
                            status=413, code="request_too_large", close=True)

    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > config.max_body_bytes:
        raise too_large()  # before reading any of it

    async def read() -> bytes:
        data = bytearray()
        async for piece in request.stream():
            data += piece
            if len(data) > config.max_body_bytes:
                raise too_large()
        return bytes(data)

    # A deadline for the whole body, not for each piece: a client trickling a byte a second
    # would pass any per-piece timeout while holding its connection for days.
    try:
        return await asyncio.wait_for(read(), timeout=config.body_timeout)
    except asyncio.TimeoutError:
        raise RequestError(f"the request body did not arrive within {config.body_timeout:g} s (--body-timeout)",
                           status=408, code="request_timeout", close=True) from None


def _parse_json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}", code="invalid_json") from None


def _check_message_count(data: Any, config: ServeConfig) -> None:
    """Refuse a conversation longer than ``max_messages`` before it is validated or rendered."""
    messages = data.get("messages") if isinstance(data, dict) else None
    if isinstance(messages, list) and len(messages) > config.max_messages:
        raise RequestError(f"messages: {len(messages):,} messages; this server takes at most {config.max_messages:,} "
                           "per request (--max-messages)", status=413, param="messages",
                           code="request_too_large")


def _check_model(name: str, config: ServeConfig) -> None:
    if name != config.model_id:
        raise RequestError(f"the model {name!r} does not exist here; this server serves {config.model_id!r} "
                           f"(GET /v1/models)", status=404, param="model", code="model_not_found")


def _prompt_ids(prompt: str | list[int], tokenizer: Any, vocab_size: int, param: str) -> list[int]:
    if isinstance(prompt, str):
        try:
            return list(tokenizer.encode(prompt))
        except UserError as exc:  # a checkpoint without a tokenizer takes token ids only
            raise RequestError(str(exc), param=param) from None
        except UnicodeError as exc:  # a lone surrogate ("\\ud800") is valid JSON but not text
            raise RequestError(f"{param}: not valid Unicode text ({exc.reason} at position {exc.start})",
                               param=param) from None
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise RequestError(f"{param}: token id {bad[0]} is outside the vocabulary (0..{vocab_size - 1})", param=param)
    return list(prompt)


# -- error responses ------------------------------------------------------------------------------


async def _request_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestError)
    return JSONResponse(exc.body(), status_code=exc.status, headers={"Connection": "close"} if exc.close else None)


async def _client_gone(request: Request, exc: Exception) -> Response:
    # An everyday event (a closed tab, a killed script), not a server fault: one line, no traceback.
    client = f"{request.client.host}:{request.client.port}" if request.client else "a client"
    log.warning("%s disconnected during %s %s before its request was read", client, request.method, request.url.path)
    return Response(status_code=499)  # nobody reads it: the connection is gone


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    message = f"{request.method} {request.url.path}: {exc.detail}"
    if exc.status_code == 404:
        message += ("; the routes are GET /v1/models, GET /v1/models/{id}, POST /v1/completions, "
                    "POST /v1/chat/completions, GET /v1/stats, GET /health and GET /")
    error = RequestError(message, status=exc.status_code, code=code)
    return JSONResponse(error.body(), status_code=exc.status_code, headers=getattr(exc, "headers", None))


async def _server_error(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    error = RequestError(f"internal error: {type(exc).__name__}: {exc}", status=500, type="server_error")
    return JSONResponse(error.body(), status_code=500)
