"""Hook implementations of the generate plugin: its hooks, the ``sampler`` kind and its components,
the ``generate`` spec section and the ``specformer generate`` command."""

from __future__ import annotations

from typing import Any

from specformer.hookspecs import hookimpl
from specformer.registry import PluginRegistry
from specformer_generate import hookspecs
from specformer_generate.samplers import (FrequencyPenalty, Greedy, MinP, NoRepeatNGram, PresencePenalty,
                                          RepetitionPenalty, Temperature, TopK, TopP, Typical)
from specformer_generate.section import GenerateSpec

#: The kind this plugin owns: what a spec's ``generate.sampler`` list names.
SAMPLER_KIND = "sampler"


@hookimpl
def specformer_add_hookspecs(pluginmanager: Any) -> None:
    pluginmanager.add_hookspecs(hookspecs)


@hookimpl
def specformer_add_kinds(registry: PluginRegistry) -> None:
    registry.add_kind(SAMPLER_KIND, doc="A step that turns next-token logits into a choice (a logits processor or a draw).")


@hookimpl
def specformer_register_components(registry: PluginRegistry) -> None:
    def add(name: str, cls: type, paper: str | None = None) -> None:
        registry.register(SAMPLER_KIND, name, factory=cls.from_params, params=cls.Params, doc=cls.__doc__, paper=paper)

    add("temperature", Temperature)
    add("top_k", TopK, "https://arxiv.org/abs/1805.04833")
    add("top_p", TopP, "https://arxiv.org/abs/1904.09751")
    add("min_p", MinP, "https://arxiv.org/abs/2407.01082")
    add("typical", Typical, "https://arxiv.org/abs/2202.00666")
    add("repetition_penalty", RepetitionPenalty, "https://arxiv.org/abs/1909.05858")
    add("frequency_penalty", FrequencyPenalty, "https://platform.openai.com/docs/advanced-usage/frequency-and-presence-penalties")
    add("presence_penalty", PresencePenalty, "https://platform.openai.com/docs/advanced-usage/frequency-and-presence-penalties")
    add("no_repeat_ngram", NoRepeatNGram, "https://arxiv.org/abs/1705.04304")
    add("greedy", Greedy)
    registry.add_section("generate", GenerateSpec)


@hookimpl
def specformer_register_commands(commands: Any) -> None:
    from specformer_generate.cli import configure, configure_chat, run  # late: only a command line needs the parsers

    commands.add("generate", help="Continue a prompt with a trained checkpoint (sampling, beam search, streaming).",
                 configure=configure, run=run)
    commands.add("chat", help="Talk with a checkpoint turn by turn on standard input (KV cache kept between turns).",
                 configure=configure_chat, run=run)
