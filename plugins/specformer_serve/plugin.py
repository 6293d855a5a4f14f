"""Hook implementations of the serve plugin: the ``specformer serve`` command."""

from __future__ import annotations

from typing import Any

from specformer.registry.hookspecs import hookimpl


@hookimpl
def specformer_register_commands(commands: Any) -> None:
    from specformer_serve.cli import configure  # late: only a command line needs the parser

    commands.add("serve", help="Serve a checkpoint over an OpenAI-compatible HTTP API (continuous batching, playground).",
                 configure=configure,
                 run="specformer_serve.serve_command:run")
