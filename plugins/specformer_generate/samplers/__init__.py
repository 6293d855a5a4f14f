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

__all__ = [
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
