"""The plugin module named by the entry point: specformer calls the hooks defined here."""

from __future__ import annotations

from typing import Any

from specformer.registry.hookspecs import hookimpl
from specformer.registry.components import PluginRegistry

from specformer_tutorial import command
from specformer_tutorial.params import DyTParams, EtaSamplingParams


@hookimpl
def specformer_register_components(registry: PluginRegistry) -> None:
    # By path: the classes (and torch) are imported only when something is built.
    registry.register("norm", "dyt", factory="specformer_tutorial.dyt:DyT", params=DyTParams,
                      paper="https://arxiv.org/abs/2503.10622")
    registry.register("sampler", "eta", factory="specformer_tutorial.eta:EtaSampling", params=EtaSamplingParams,
                      paper="https://arxiv.org/abs/2210.15191")


@hookimpl
def specformer_register_commands(commands: Any) -> None:
    commands.add("dyt-swap", help="Print a spec with DyT in place of every norm.",
                 configure=command.configure, run=command.run)
