"""Hook implementations of the eval plugin: the ``specformer eval`` and ``specformer inspect`` commands."""

from __future__ import annotations

from typing import Any

from specformer.registry.hookspecs import hookimpl


@hookimpl
def specformer_register_commands(commands: Any) -> None:
    from specformer_eval import cli, inspect_cli  # late: only a command line needs the parsers

    commands.add(
        "eval",
        help="Measure a checkpoint: loss, perplexity and bits per byte over text (sliding windows, streamed).",
        configure=cli.configure,
        run="specformer_eval.eval_command:run",
    )
    commands.add(
        "inspect",
        help="Draw one forward pass of a checkpoint: attention maps, one token's attention, the logit lens, a page.",
        configure=inspect_cli.configure,
        run="specformer_eval.inspect_command:run",
    )
