"""Hook implementations of the hf plugin: its family hook, the ``specformer hf`` command and the built-in families."""

from __future__ import annotations

from typing import Any

from specformer.registry.hookspecs import hookimpl

from specformer_hf import hookspecs


@hookimpl
def specformer_add_hookspecs(pluginmanager: Any) -> None:
    pluginmanager.add_hookspecs(hookspecs)  # specformer_hf_register_families, for plugins that add families


@hookimpl
def specformer_register_commands(commands: Any) -> None:
    from specformer_hf.cli import configure  # late: only a command line needs the parser

    commands.add(
        "hf",
        help="Import a Hugging Face model directory to a checkpoint, or export a checkpoint to one.",
        configure=configure,
        run="specformer_hf.hf_command:run",
    )


@hookimpl
def specformer_hf_register_families(families: Any) -> None:
    from specformer_hf.families import builtin_families  # late: the families' rules import torch

    for family in builtin_families():
        families.add(family)
