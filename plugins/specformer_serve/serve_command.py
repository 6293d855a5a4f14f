"""``specformer serve CKPT``: an OpenAI-compatible HTTP server for a checkpoint.

Its flags: :mod:`specformer_serve.cli`.

Needs the ``serve`` extra (Starlette, uvicorn, Jinja2), imported only when the command runs,
so other commands never pay for it. Loads the checkpoint (any checkpoint ``specformer.load`` reads: float, quantized, ...) and
its tokenizer, sizes the paged KV cache from ``--max-tokens-in-flight``, and serves until
Ctrl-C. Every check (device, chat template, port) runs before the server starts, each a
one-line error with exit code 2.
"""

from __future__ import annotations

import argparse
import importlib.util
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
from specformer.checkpoint.locate import resolve_checkpoint
from specformer_text import TurnEnd

from specformer_serve import hosts, origin
from specformer_serve.chat_template import chat_renderer
from specformer_serve.cli import API_KEY_ENV
from specformer_serve.engine import Engine

#: Seconds a Python thread may hold the GIL while another waits (CPython's default is 0.005).
SWITCH_INTERVAL = 0.0005


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
        allowed_hosts = hosts.check_allowed(args.allowed_host)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    named = Path(args.checkpoint).name.removesuffix(".safetensors")  # a run directory's name, not model.safetensors'
    args.checkpoint = str(resolve_checkpoint(args.checkpoint))  # a step-N or run directory: its checkpoint file
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
    config = ServeConfig(model_id=args.model_name or named,
                         tokenizer=tokenizer, render_chat=template.render, api_key=api_key,
                         eos=frozenset() if args.ignore_eos or eot is None else frozenset([eot]),
                         turn_end=TurnEnd() if args.ignore_eos else template.turn_end(tokenizer, metadata),
                         max_body_bytes=args.max_body_bytes, body_timeout=args.body_timeout,
                         max_messages=args.max_messages, allow_origins=allow_origins,
                         allowed_hosts=allowed_hosts)
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
    if api_key is None and not hosts.is_loopback(args.host):
        print(f"note: listening on {args.host} without --api-key: anyone who can reach this address can use the model",
              file=sys.stderr)
    # The engine thread gives up the GIL inside every PyTorch call; with the default 5 ms switch
    # interval, getting it back from a busy event loop can cost up to 5 ms a time, many times a step.
    sys.setswitchinterval(SWITCH_INTERVAL)
    server.run()
    return 0


def _require_server_stack() -> None:
    """The HTTP stack is an optional extra; its absence is one line saying how to install it."""
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

