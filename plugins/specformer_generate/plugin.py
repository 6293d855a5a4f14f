"""Hook implementations of the generate plugin: sampler components, the ``generate`` spec section
and the ``specformer generate`` command."""

from __future__ import annotations

from typing import Any

from specformer.hookspecs import hookimpl
from specformer.registry import PluginRegistry
from specformer_generate.samplers import BUILTIN_SAMPLERS
from specformer_generate.section import GenerateSpec


@hookimpl
def specformer_register_components(registry: PluginRegistry) -> None:
    for name, (cls, paper) in BUILTIN_SAMPLERS.items():
        registry.register("sampler", name, factory=cls.from_params, params=cls.Params, doc=cls.__doc__, paper=paper)
    registry.add_section("generate", GenerateSpec)


@hookimpl
def specformer_register_commands(commands: Any) -> None:
    from specformer_generate.cli import configure, configure_chat, run

    commands.add("generate", help="Continue a prompt with a trained checkpoint (sampling, beam search, streaming).",
                 configure=configure, run=run)
    commands.add("chat", help="Talk with a checkpoint turn by turn on standard input (KV cache kept between turns).",
                 configure=configure_chat, run=run)
