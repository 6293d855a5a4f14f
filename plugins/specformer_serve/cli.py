"""The flags of ``specformer serve CKPT``.

Only the parser, built for every ``specformer --help``, so it imports neither torch nor the
server stack; :mod:`specformer_serve.serve_command` runs the command.
"""

from __future__ import annotations

import argparse

from specformer_text import DEFAULT_MAX_OUTPUT, DEFAULT_TIMEOUT

from specformer_serve import limits

#: The environment variable read when --api-key is not given.
API_KEY_ENV = "SPECFORMER_API_KEY"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="a .safetensors checkpoint written by specformer, a run's checkpoints/step-N "
                                           "directory, or a run directory (its latest checkpoint)")
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
    group.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                       help="also answer requests addressed (Host header) to this name, as a reverse proxy's or a "
                            "hosts-file alias; repeatable (default: a server on a loopback address answers only "
                            "localhost, 127.0.0.0/8 and [::1], against DNS rebinding; one on another address "
                            "checks the Host only when this is given)")
    parser.add_argument("--ignore-eos", action="store_true",
                        help="do not end a choice at the end-of-text token, nor a chat reply at the chat template's "
                             "end of turn (benchmarks: fixed lengths)")
    parser.add_argument("--device", default="cpu", help="device to run on: cpu, cuda, cuda:1, mps (default cpu)")
    parser.add_argument("--threads", default="auto", metavar="N", help="CPU threads: a number, or auto (default)")

