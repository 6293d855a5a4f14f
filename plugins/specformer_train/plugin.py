"""Hook implementations of the train plugin: its training hooks, the ``train:`` spec section, the ``optimizer`` and
``logger`` kinds and the ``train`` and ``checkpoint`` commands."""

from __future__ import annotations

from typing import Any

from specformer.registry.hookspecs import hookimpl
from specformer.registry.components import PluginRegistry

from specformer_train import hookspecs, loggers, optimizers
from specformer_train.config import TrainSpec


@hookimpl
def specformer_add_hookspecs(pluginmanager: Any) -> None:
    pluginmanager.add_hookspecs(hookspecs)  # the training events loggers and callbacks implement


@hookimpl
def specformer_add_kinds(registry: PluginRegistry) -> None:
    # Before any plugin registers an optimizer or a logger, whatever order the plugins load in.
    registry.add_kind(optimizers.KIND, doc=optimizers.KIND_DOC, sizes=optimizers.SIZES)
    registry.add_kind(loggers.KIND, doc=loggers.KIND_DOC, sizes=loggers.SIZES)


@hookimpl
def specformer_register_components(registry: PluginRegistry) -> None:
    registry.add_section("train", TrainSpec)
    optimizers.register_optimizers(registry)
    loggers.register_loggers(registry)


@hookimpl
def specformer_register_commands(commands: Any) -> None:
    from specformer_train import checkpoint_command, cli  # late: only a command line needs the parser

    commands.add(
        "train",
        help="Train the model of a spec on a corpus (default: the Python standard library's source).",
        configure=cli.configure,
        run=cli.run,
    )
    commands.add("checkpoint", help=checkpoint_command.HELP, configure=checkpoint_command.configure,
                 run="specformer_train.checkpoint_command:run")
