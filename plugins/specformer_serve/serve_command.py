"""``specformer serve CKPT``: an OpenAI-compatible HTTP server for a checkpoint.

Needs the ``serve`` extra (Starlette, uvicorn, Jinja2), imported only when the command runs,
so other commands never pay for it. Loads the checkpoint (any checkpoint ``specformer.load`` reads: float, quantized, ...) and
its tokenizer, sizes the paged KV cache from ``--max-tokens-in-flight``, and serves until
Ctrl-C. Every check (device, chat template, port) runs before the server starts, each a
one-line error with exit code 2.
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import os
import sys
from pathlib import Path

import specformer
from specformer.checkpoint.save_load import read_metadata
from specformer.machine.devices import parse_device
from specformer.errors import UserError
from specformer.machine.threads import use_threads
from specformer.tokenizers.choice import checkpoint_tokenizer
from specformer_text import DEFAULT_MAX_OUTPUT, DEFAULT_TIMEOUT, TurnEnd

from specformer_serve import limits, origin
from specformer_serve.chat_template import chat_renderer
from specformer_serve.engine import Engine

#: Seconds a Python thread may hold the GIL while another waits (CPython's default is 0.005).
SWITCH_INTERVAL = 0.0005
#: The environment variable read when --api-key is not given.
API_KEY_ENV = "SPECFORMER_API_KEY"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="a .safetensors checkpoint written by specformer")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 picks a free one)")
    parser.add_argument("--max-batch", type=int, default=16, metavar="N",
                        help="most requests (choices) decoded together in one step (default 16)")
    parser.add_argument("--max-tokens-in-flight", type=int, default=None, metavar="N",
                        help="KV cache size in tokens shared by all running requests; a request waits until its "
                             "prompt + max_tokens fits (default: max-batch x the context length, at most 65536)")
    parser.add_argument("--block-size", type=int, default=16, metavar="N",
                        help="tokens per KV cache block (default 16)")
    parser.add_argument("--api-key", default=None,
                        help=f"require 'Authorization: Bearer KEY' on /v1/ routes (default: ${API_KEY_ENV} if set)")
    parser.add_argument("--model-name", default=None,
                        help="the model id clients send and /v1/models lists (default: the checkpoint's file name "
                             "without .safetensors)")
    parser.add_argument("--chat-template", default=None, metavar="FILE",
                        help="a Jinja chat template file, a built-in name (chatml), or a checkpoint whose header holds "
                             "a template (a full fine-tune's base), for /v1/chat/completions "
                             "(default: the checkpoint's own, else one 'role: content' line per message)")
    parser.add_argument("--chat-template-timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                        help=f"most time one rendering of the chat template may take (default {DEFAULT_TIMEOUT:g})")
    parser.add_argument("--chat-template-max-chars", type=int, default=DEFAULT_MAX_OUTPUT, metavar="N",
                        help=f"most characters a rendering, or any value the template builds, may hold "
                             f"(default {DEFAULT_MAX_OUTPUT})")
    group = parser.add_argument_group("limits on clients")
    group.add_argument("--max-connections", type=int, default=limits.MAX_CONNECTIONS, metavar="N",
                       help=f"most connections open at once; requests past it are answered 503 "
                            f"(default {limits.MAX_CONNECTIONS})")
    group.add_argument("--header-timeout", type=float, default=limits.HEADER_TIMEOUT, metavar="SECONDS",
                       help=f"a request's line and headers must arrive within this, else 408 and the connection is "
                            f"closed (default {limits.HEADER_TIMEOUT:g})")
    group.add_argument("--body-timeout", type=float, default=limits.BODY_TIMEOUT, metavar="SECONDS",
                       help=f"a request's whole body must arrive within this after its headers, else 408 and the "
                            f"connection is closed (default {limits.BODY_TIMEOUT:g})")
    group.add_argument("--max-body-bytes", type=int, default=limits.MAX_BODY_BYTES, metavar="N",
                       help=f"largest request body; a larger one is 413 (default {limits.MAX_BODY_BYTES}: 4 MiB)")
    group.add_argument("--max-messages", type=int, default=limits.MAX_MESSAGES, metavar="N",
                       help=f"most messages in one chat request; more is 413 before anything is rendered "
                            f"(default {limits.MAX_MESSAGES})")
    group.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                       help="let web pages from this origin (scheme://host[:port], or * for any) POST to the API; "
                            "repeatable (default: only the server's own pages, such as the playground; clients that "
                            "send no Origin header, such as curl and SDKs, are always served)")
    parser.add_argument("--ignore-eos", action="store_true",
                        help="do not end a choice at the end-of-text token, nor a chat reply at the chat template's "
                             "end of turn (benchmarks: fixed lengths)")
    parser.add_argument("--device", default="cpu", help="device to run on: cpu, cuda, cuda:1, mps (default cpu)")
    parser.add_argument("--threads", default="auto", metavar="N", help="CPU threads: a number, or auto (default)")


def run(args: argparse.Namespace) -> int:
    _require_server_stack()
    for name in ("max_batch", "block_size", "chat_template_max_chars", "max_connections", "max_body_bytes",
                 "max_messages"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    for name in ("chat_template_timeout", "header_timeout", "body_timeout"):
        if not 0 < getattr(args, name) < math.inf:
            raise UserError(f"--{name.replace('_', '-')} must be a number of seconds above 0, got "
                            f"{getattr(args, name)}")
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port must be in 0..65535, got {args.port}")
    device = parse_device(args.device)
    use_threads(args.threads)
    api_key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None
    if api_key is not None and not api_key.strip():
        raise UserError("--api-key is empty; give a key, or leave it out to serve without one")
    try:
        allow_origins = origin.check_allowed(args.allow_origin)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    metadata = read_metadata(args.checkpoint)
    template = chat_renderer(args.chat_template, metadata, timeout=args.chat_template_timeout,
                             max_output=args.chat_template_max_chars)
    model = specformer.load(args.checkpoint, device=device).eval()
    tokenizer = checkpoint_tokenizer(metadata, vocab_size=model.vocab_size, where=args.checkpoint, ids_only=True)
    in_flight = args.max_tokens_in_flight
    if in_flight is None:
        in_flight = min(args.max_batch * model.context_length, 65536)
    if in_flight < 1:
        raise UserError(f"--max-tokens-in-flight must be at least 1, got {in_flight}")
    try:
        engine = Engine(model, max_batch=args.max_batch, num_blocks=math.ceil(in_flight / args.block_size),
                        block_size=args.block_size)
    except ValueError as exc:  # an attention layer this cache cannot hold
        raise UserError(f"cannot serve {args.checkpoint}: {exc}") from None
    from specformer_serve.app import ServeConfig  # late: starlette, the serve extra, checked by _require_server_stack

    eot = getattr(tokenizer, "eot_id", None)
    config = ServeConfig(model_id=args.model_name or Path(args.checkpoint).name.removesuffix(".safetensors"),
                         tokenizer=tokenizer, render_chat=template.render, api_key=api_key,
                         eos=frozenset() if args.ignore_eos or eot is None else frozenset([eot]),
                         turn_end=TurnEnd() if args.ignore_eos else template.turn_end(tokenizer, metadata),
                         max_body_bytes=args.max_body_bytes, body_timeout=args.body_timeout,
                         max_messages=args.max_messages, allow_origins=allow_origins)
    from specformer_serve.server import Server  # late: uvicorn, as above

    try:
        server = Server(engine, config, host=args.host, port=args.port, header_timeout=args.header_timeout,
                        max_connections=args.max_connections)
    except OSError as exc:
        raise UserError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    cache_mib = engine.cache.nbytes / 2**20
    print(f"serving {config.model_id!r} on {server.url} (playground at {server.url}/, OpenAI API at {server.url}/v1); "
          f"KV cache {engine.pool.num_blocks} blocks x {args.block_size} tokens ({cache_mib:.1f} MiB), "
          f"up to {args.max_batch} requests per step; chat through {template.where}"
          f"{'; API key required' if api_key else ''}; Ctrl-C stops",
          file=sys.stderr, flush=True)
    if api_key is None and not _loopback(args.host):
        print(f"note: listening on {args.host} without --api-key: anyone who can reach this address can use the model",
              file=sys.stderr)
    # The engine thread gives up the GIL inside every PyTorch call; with the default 5 ms switch
    # interval, getting it back from a busy event loop can cost up to 5 ms a time, many times a step.
    sys.setswitchinterval(SWITCH_INTERVAL)
    server.run()
    return 0


def _require_server_stack() -> None:
    """The HTTP stack is an optional extra; its absence is one line saying how to install it."""
    import importlib.util

    missing = []
    for name in ("starlette", "uvicorn", "jinja2"):
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a module set to None in sys.modules, or a broken one
            found = False
        if not found:
            missing.append(name)
    if missing:
        raise UserError(f"specformer serve needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not "
                        f"installed; install the serve extra: pip install 'specformer[serve]'")


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


