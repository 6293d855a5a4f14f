"""The settings of every built-in sampler, in a module that imports no torch.

``specformer components``, ``specformer schema`` and spec validation read these models
without building a sampler. Each model's docstring is the sampler's description in the
catalogue (its first line the summary). ``CHOOSES_TOKEN`` marks a sampler that picks the
token itself instead of processing logits, so the ``generate`` section can check that it
comes last without importing the sampler.
"""

from __future__ import annotations

import warnings
from typing import Any, ClassVar, Iterable

from pydantic import Field, field_validator

from specformer.registry.params import Params


class SamplerParams(Params):
    """Base of the sampler settings: ``CHOOSES_TOKEN`` is True for a sampler that picks the token itself,
    ``CONSTRAINT`` for one that allows only the tokens a grammar accepts (:mod:`.constraint`)."""

    CHOOSES_TOKEN: ClassVar[bool] = False
    CONSTRAINT: ClassVar[bool] = False


def check_chooser_last(entries: Iterable[tuple[str, bool]]) -> None:
    """Refuse a list whose entry that chooses the token (``(name, chooses)``) is not the last one.

    The one rule for the ``generate`` section (which knows the entries by their params) and
    for :class:`~specformer_generate.samplers.pipeline.Sampler` (which knows built steps).
    """
    entries = list(entries)
    for i, (name, chooses) in enumerate(entries[:-1]):
        if chooses:
            raise ValueError(f"sampler entry {i} ({name}) chooses the token itself, so it must be the last entry; "
                             f"got it before {len(entries) - 1 - i} more")


def check_constraint_first(entries: Iterable[tuple[str, bool]]) -> None:
    """Refuse a list with more than one constraint (``(name, is_constraint)``), or with one that is not the first entry.

    A filter before the constraint (top_k, say) could keep only tokens the constraint forbids,
    leaving nothing to draw; after it, the filters choose among the tokens it allows.
    """
    entries = list(entries)
    found = [(i, name) for i, (name, constraint) in enumerate(entries) if constraint]
    if len(found) > 1:
        raise ValueError(f"one constraint per sampler list, got {len(found)}: "
                         + ", ".join(f"entry {i} ({name})" for i, name in found))
    if found and found[0][0] != 0:
        i, name = found[0]
        raise ValueError(f"sampler entry {i} ({name}) is a constraint, so it must be the first entry (the filters "
                         f"after it then choose among the tokens it allows); got it after {i} other entries")


class TemperatureParams(SamplerParams):
    """Divide the logits by ``value``: ``softmax(z / T)``.

    ``T < 1`` concentrates probability on the likeliest tokens, ``T > 1`` spreads it out.
    A temperature of 0 is not a distribution; use ``greedy`` for argmax decoding. ``T``
    must be finite: an infinite temperature would turn a filtered token's ``-inf`` into
    NaN. Filtered tokens stay ``-inf``, and a very small ``T`` saturates at the largest
    finite logit instead of overflowing (the limit ``T -> 0`` is argmax, ties aside).
    """

    value: float = Field(gt=0, allow_inf_nan=False,
                         description="The temperature T > 0, finite; logits become logits / T. Use greedy for T -> 0.")


class TopKParams(SamplerParams):
    """Keep the ``k`` likeliest tokens; every other logit becomes ``-inf``.

    A token tied with the k-th largest logit is kept too, so more than ``k`` tokens can
    survive when logits tie (the rule Hugging Face transformers uses).
    """

    k: int = Field(gt=0, description="Number of likeliest tokens kept.")
    min_tokens_to_keep: int = Field(default=1, ge=1, description="Never keep fewer tokens than this.")


class TopPParams(SamplerParams):
    """Keep the smallest set of likeliest tokens whose probabilities add up to at least ``p``.

    Tokens are sorted by probability; walking up from the least likely, a token is
    dropped while the mass of it and everything below it is at most ``1 - p``. The
    ``min_tokens_to_keep`` likeliest tokens always stay.
    """

    p: float = Field(gt=0, le=1, description="Probability mass kept, in (0, 1]; 1 keeps every token.")
    min_tokens_to_keep: int = Field(default=1, ge=1, description="Never keep fewer tokens than this.")


class MinPParams(SamplerParams):
    """Drop tokens less likely than ``p`` times the likeliest token's probability.

    The threshold scales with the model's confidence: a peaked distribution keeps few
    tokens, a flat one many. The ``min_tokens_to_keep`` likeliest tokens always stay.
    """

    p: float = Field(ge=0, le=1, description="Fraction of the top probability a token needs, in [0, 1].")
    min_tokens_to_keep: int = Field(default=1, ge=1, description="Never keep fewer tokens than this.")


class TypicalParams(SamplerParams):
    """Keep the tokens whose surprisal is closest to the distribution's entropy, up to mass ``p``.

    With ``H = -sum p_i log p_i``, tokens are ranked by ``|-log p_i - H|`` (most typical
    first) and kept until their probabilities add up to ``p``; the token that crosses
    ``p`` is kept, and so is every token tied with it. The likeliest token may be dropped.
    """

    p: float = Field(gt=0, lt=1, description="Probability mass of the most typical tokens kept, in (0, 1).")
    min_tokens_to_keep: int = Field(default=1, ge=1, description="Never keep fewer tokens than this.")


class RepetitionPenaltyParams(SamplerParams):
    """Make every token already in the sequence (prompt included) less likely, once per token.

    A seen token's logit ``z`` becomes ``z / penalty`` when positive and ``z * penalty``
    when negative, so ``penalty > 1`` discourages repeats and ``penalty < 1`` encourages
    them; how often the token occurred does not matter. Negative ids (padding) are ignored.
    """

    penalty: float = Field(gt=0, description="> 1 discourages repeats, < 1 encourages them, 1 does nothing.")


class FrequencyPenaltyParams(SamplerParams):
    """Subtract ``penalty`` times the number of occurrences of each token: ``z_j - c_j * penalty``."""

    penalty: float = Field(ge=-2, le=2, description="Subtracted from a logit per occurrence of its token, in [-2, 2].")


class PresencePenaltyParams(SamplerParams):
    """Subtract ``penalty`` once from every token that occurred at all: ``z_j - (c_j > 0) * penalty``."""

    penalty: float = Field(ge=-2, le=2,
                           description="Subtracted once from the logit of every token already present, in [-2, 2].")


class NoRepeatNGramParams(SamplerParams):
    """Ban every token that would complete an ``n``-gram already present in the sequence.

    The last ``n - 1`` tokens form a prefix; wherever the same prefix occurred before,
    the token that followed it there gets ``-inf``. ``n = 1`` bans every token seen.
    The prompt counts; padding (negative ids) never matches a real prefix.
    """

    n: int = Field(gt=0, description="Length of the n-grams that may occur only once.")


class GreedyParams(SamplerParams):
    """Choose the token with the largest processed logit instead of drawing one.

    Must be the last entry of a sampler list; the processors before it (repetition
    penalties, n-gram bans) still apply. Among tied logits the lowest id wins.
    """

    CHOOSES_TOKEN: ClassVar[bool] = True


class ConstraintParams(SamplerParams):
    """Base of the constraint settings: the generated text must match a grammar (llguidance compiles it)."""

    CONSTRAINT: ClassVar[bool] = True


class RegexParams(ConstraintParams):
    """Allow only tokens that keep the generated text a prefix of a match of ``pattern``; end when it is complete.

    The whole generated part must match (as ``re.fullmatch``; the prompt is not matched). Each
    step sets the logit of every token that would leave no match possible to ``-inf``; once
    the text can go no further only the end-of-sequence token is allowed, and where the text
    is complete but could go on, the model chooses. The pattern is in the Rust ``regex``
    syntax llguidance reads (Python's for everything but look-around and back-references).
    Must be the first sampler entry. Needs the model's tokenizer and an end-of-sequence id.
    """

    pattern: str = Field(min_length=1, examples=["[0-9]{4}-[0-9]{2}-[0-9]{2}"],
                         description="The regular expression the whole generated text must match.")


class ChoiceParams(ConstraintParams):
    """Allow only tokens that spell one of ``options`` exactly, then end.

    The generated text is one of the strings, whole. Must be the first sampler entry.
    Needs the model's tokenizer and an end-of-sequence id.
    """

    options: list[str] = Field(min_length=1, description="The strings allowed; each non-empty.")

    @field_validator("options")
    @classmethod
    def _not_empty(cls, value: list[str]) -> list[str]:
        empty = [i for i, option in enumerate(value) if not option]
        if empty:
            raise ValueError(f"option {empty[0]} is empty; every option needs some text")
        return value


with warnings.catch_warnings():
    # The field is called `schema` as everywhere else (OpenAI, outlines, vLLM); it hides
    # pydantic's deprecated classmethod BaseModel.schema, which nothing here calls.
    warnings.filterwarnings("ignore", message='Field name "schema"', category=UserWarning)

    class JsonSchemaParams(ConstraintParams):
        """Allow only tokens that keep the generated text a prefix of a JSON value ``schema`` accepts; end when complete.

        ``schema`` is a JSON Schema as an object, or the path of a JSON file holding one. The
        output parses with ``json.loads`` and validates against the schema (the keywords
        llguidance supports; a schema using others is refused when the sampler is built).
        Whitespace is compact. Must be the first sampler entry. Needs the model's tokenizer
        and an end-of-sequence id.
        """

        schema: dict[str, Any] | str = Field(
            description="A JSON Schema object, or the path of a JSON file holding one.")


class GrammarParams(ConstraintParams):
    """Allow only tokens that keep the generated text a prefix of a sentence of the Lark grammar ``lark``.

    The grammar is in the Lark syntax llguidance reads (``start:`` is the start rule;
    ``/regex/`` terminals, ``%json {...}`` for an embedded schema). Once the sentence is
    complete and cannot go on, only the end-of-sequence token is allowed. Must be the first
    sampler entry. Needs the model's tokenizer and an end-of-sequence id.
    """

    lark: str = Field(min_length=1, examples=['start: NUM ("+" NUM)*\nNUM: /[0-9]+/'],
                      description="The grammar's text, in llguidance's Lark syntax.")
