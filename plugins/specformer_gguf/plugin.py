"""Hook implementations of the GGUF plugin: the ``specformer export gguf`` command."""

from __future__ import annotations

from typing import Any

from specformer.registry.hookspecs import hookimpl


@hookimpl
def specformer_register_commands(commands: Any) -> None:
    from specformer_gguf.cli import configure  # late: only a command line needs the parser

    commands.add("export", help="Write a checkpoint in another runtime's format: GGUF for llama.cpp.",
                 configure=configure, run="specformer_gguf.export_command:run")
