"""Sampler components: logits processors and choices, composed in a spec's ``generate.sampler`` list."""

from __future__ import annotations

from specformer_generate.samplers.greedy import Greedy
from specformer_generate.samplers.min_p import MinP
from specformer_generate.samplers.no_repeat_ngram import NoRepeatNGram
from specformer_generate.samplers.penalties import FrequencyPenalty, PresencePenalty
from specformer_generate.samplers.pipeline import Sampler, build_sampler, draw, greedy
from specformer_generate.samplers.repetition import RepetitionPenalty
from specformer_generate.samplers.temperature import Temperature
from specformer_generate.samplers.top_k import TopK
from specformer_generate.samplers.top_p import TopP
from specformer_generate.samplers.typical import Typical

#: name -> (class, paper): what the plugin registers as components of kind ``sampler``.
BUILTIN_SAMPLERS: dict[str, tuple[type, str | None]] = {
    "temperature": (Temperature, None),
    "top_k": (TopK, "https://arxiv.org/abs/1805.04833"),
    "top_p": (TopP, "https://arxiv.org/abs/1904.09751"),
    "min_p": (MinP, "https://arxiv.org/abs/2407.01082"),
    "typical": (Typical, "https://arxiv.org/abs/2202.00666"),
    "repetition_penalty": (RepetitionPenalty, "https://arxiv.org/abs/1909.05858"),
    "frequency_penalty": (FrequencyPenalty, "https://platform.openai.com/docs/advanced-usage/frequency-and-presence-penalties"),
    "presence_penalty": (PresencePenalty, "https://platform.openai.com/docs/advanced-usage/frequency-and-presence-penalties"),
    "no_repeat_ngram": (NoRepeatNGram, "https://arxiv.org/abs/1705.04304"),
    "greedy": (Greedy, None),
}

__all__ = [
    "BUILTIN_SAMPLERS",
    "FrequencyPenalty",
    "Greedy",
    "MinP",
    "NoRepeatNGram",
    "PresencePenalty",
    "RepetitionPenalty",
    "Sampler",
    "Temperature",
    "TopK",
    "TopP",
    "Typical",
    "build_sampler",
    "draw",
    "greedy",
]
