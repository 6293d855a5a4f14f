"""The plugin module named by the entry point: specformer calls the hooks defined here."""

from __future__ import annotations

from typing import Any

from specformer.registry.hookspecs import hookimpl
from specformer.registry.components import PluginRegistry

from specformer_tutorial import command
from specformer_tutorial.dyt import DyT
from specformer_tutorial.eta import EtaSampling


@hookimpl
def specformer_register_components(registry: PluginRegistry) -> None:
    registry.register("norm", "dyt", factory=DyT.from_params, params=DyT.Params,
                      paper="https://arxiv.org/abs/2503.10622")
    registry.register("sampler", "eta", factory=EtaSampling.from_params, params=EtaSampling.Params,
                      paper="https://arxiv.org/abs/2210.15191")


@hookimpl
def specformer_register_commands(commands: Any) -> None:
    commands.add("dyt-swap", help="Print a spec with DyT in place of every norm.",
                 configure=command.configure, run=command.run)
