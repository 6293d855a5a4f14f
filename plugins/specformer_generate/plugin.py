"""Hook implementations of the generate plugin: its hooks, the ``sampler`` kind and its components,
the ``generate`` spec section and the ``specformer generate`` command."""

from __future__ import annotations

from typing import Any

from specformer.registry.hookspecs import hookimpl
from specformer.registry.components import PluginRegistry
from specformer_generate import hookspecs
from specformer_generate.samplers import params as sampler_params
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
    # By factory path: listing samplers and checking a spec import no torch.
    def add(name: str, factory: str, params: type, paper: str | None = None) -> None:
        registry.register(SAMPLER_KIND, name, factory=f"specformer_generate.samplers.{factory}", params=params,
                          paper=paper)

    add("temperature", "temperature:Temperature", sampler_params.TemperatureParams)
    add("top_k", "top_k:TopK", sampler_params.TopKParams, "https://arxiv.org/abs/1805.04833")
    add("top_p", "top_p:TopP", sampler_params.TopPParams, "https://arxiv.org/abs/1904.09751")
    add("min_p", "min_p:MinP", sampler_params.MinPParams, "https://arxiv.org/abs/2407.01082")
    add("typical", "typical:Typical", sampler_params.TypicalParams, "https://arxiv.org/abs/2202.00666")
    add("repetition_penalty", "repetition:RepetitionPenalty", sampler_params.RepetitionPenaltyParams,
        "https://arxiv.org/abs/1909.05858")
    add("frequency_penalty", "penalties:FrequencyPenalty", sampler_params.FrequencyPenaltyParams,
        "https://platform.openai.com/docs/advanced-usage/frequency-and-presence-penalties")
    add("presence_penalty", "penalties:PresencePenalty", sampler_params.PresencePenaltyParams,
        "https://platform.openai.com/docs/advanced-usage/frequency-and-presence-penalties")
    add("no_repeat_ngram", "no_repeat_ngram:NoRepeatNGram", sampler_params.NoRepeatNGramParams,
        "https://arxiv.org/abs/1705.04304")
    add("greedy", "greedy:Greedy", sampler_params.GreedyParams)
    add("regex", "constraint:Regex", sampler_params.RegexParams, "https://github.com/guidance-ai/llguidance")
    add("choice", "constraint:Choice", sampler_params.ChoiceParams, "https://github.com/guidance-ai/llguidance")
    add("json_schema", "constraint:JsonSchema", sampler_params.JsonSchemaParams,
        "https://github.com/guidance-ai/llguidance")
    add("grammar", "constraint:Grammar", sampler_params.GrammarParams, "https://github.com/guidance-ai/llguidance")
    registry.add_section("generate", GenerateSpec)


@hookimpl
def specformer_register_commands(commands: Any) -> None:
    from specformer_generate.cli import configure, configure_chat  # late: only a command line needs the parsers

    commands.add("generate", help="Continue a prompt with a trained checkpoint (sampling, beam search, streaming).",
                 configure=configure, run="specformer_generate.generate_command:run")
    commands.add("chat", help="Talk with a checkpoint turn by turn on standard input (KV cache kept between turns).",
                 configure=configure_chat, run="specformer_generate.generate_command:run")
