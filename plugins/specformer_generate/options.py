"""The keyword options of ``generate()`` and ``stream()``, declared once.

Each option is one field of :class:`GenerationOptions`: its type, its default and what it
does. :func:`takes_options` turns a function of ``(model, input_ids, options)`` into the
public one: its signature is made from the fields (``inspect.signature`` and ``help()``
show every keyword with its default), its docstring gains their descriptions, and a call
gathers the keywords into one frozen ``GenerationOptions``. ``stream`` takes every option
but the beam search's and ``check_every``.

The values are kept as given: :mod:`specformer_generate.arguments` checks each where the
call first uses it, so that a bad one is one ``ValueError`` naming it (never a TypeError).
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, Callable, Sequence, TypeVar

_Function = TypeVar("_Function", bound=Callable[..., Any])


def _option(default: Any, doc: str, *, beams_only: bool = False) -> Any:
    """A field with its description; ``beams_only``: an option of ``generate`` that ``stream`` does not take."""
    return field(default=default, metadata={"doc": doc, "beams_only": beams_only})


@dataclass(frozen=True, kw_only=True)
class GenerationOptions:
    """The keyword options of one ``generate()`` or ``stream()`` call, as the caller gave them."""

    max_new_tokens: int = field(metadata={"doc": "The most tokens added to each prompt (required).",
                                          "beams_only": False})
    sampler: Any = _option(None, "``None`` (greedy), a list of sampler components as in a spec's "
                                 "``generate.sampler``, or a :class:`Sampler`.")
    seed: int | None = _option(None, "Seeds the draws, so that the same call returns the same tokens.")
    eos_token_id: int | Sequence[int] | None = _option(
        None, "A token id or a list of them: a row ends after one (it stays in the output).")
    stop: Sequence[Sequence[int]] | None = _option(
        None, "Token-id lists: a row ends after one of them (it stays in the output).")
    use_cache: bool = _option(True, "Decode with a static key/value cache; False encodes the whole sequence "
                                    "again for every token.")
    num_beams: int = _option(1, "Above 1: beam search (:mod:`specformer_generate.beam`).", beams_only=True)
    length_penalty: float = _option(1.0, "Beam search: a finished beam scores ``sum(log p) / length ** "
                                         "length_penalty``.", beams_only=True)
    early_stopping: bool | str = _option(False, "Beam search: True, False or ``'never'``, as in transformers.",
                                         beams_only=True)
    pad_token_id: int | None = _option(None, "What a finished row holds after its end (default: the first eos "
                                             "id, else -1).")
    compile: bool | str = _option(False, "``torch.compile`` the one-token step: True or a backend name.")
    check_every: int = _option(16, "Tokens between the host's looks at whether every row finished.",
                               beams_only=True)
    max_memory: int | str | None = _option(
        None, "The most the call may need: bytes, a size such as ``\"8GiB\"``, or ``\"unlimited\"`` (see "
              ":mod:`specformer_generate.memory`); default ``SPECFORMER_MAX_MEMORY``, else the memory available.")
    draft: Any = _option(None, "Speculative decoding (:mod:`specformer_generate.speculative`): ``\"ngram\"`` "
                               "(prompt lookup), ``\"mtp\"`` (the model's own multi-token prediction depths) "
                               "or a smaller model over the same vocabulary; the result is the same "
                               "as without it (greedy: the same tokens; sampling: the same distribution).")
    draft_tokens: int = _option(4, "Tokens the drafter proposes a round.")
    tokenizer: Any = _option(None, "The model's tokenizer (:mod:`specformer.tokenizers.tokenizer`), which a "
                                   "constraint sampler (regex, choice, json_schema, grammar) reads the text with.")

    @classmethod
    def taken(cls, *, beams: bool) -> list[Field[Any]]:
        """The options a function takes, in signature order: all of them, or (``beams=False``) all but the beam search's."""
        return [f for f in fields(cls) if beams or not f.metadata["beams_only"]]


def takes_options(*, beams: bool) -> Callable[[_Function], _Function]:
    """Give ``function(model, input_ids, options)`` the public signature ``(model, input_ids, *, <options>)``."""

    def wrap(function: _Function) -> _Function:
        taken = GenerationOptions.taken(beams=beams)
        own = list(inspect.signature(function).parameters.values())[:2]  # model, input_ids
        keywords = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, annotation=f.type,
                                      default=inspect.Parameter.empty if f.default is MISSING else f.default)
                    for f in taken]
        signature = inspect.signature(function).replace(parameters=[*own, *keywords])

        @functools.wraps(function)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError as exc:  # worded as Python words it for a plain function
                raise TypeError(f"{function.__name__}() {exc}") from None
            given = dict(bound.arguments)
            model, input_ids = given.pop(own[0].name), given.pop(own[1].name)
            return function(model, input_ids, GenerationOptions(**given))

        call.__signature__ = signature  # type: ignore[attr-defined]
        call.__doc__ = (inspect.cleandoc(function.__doc__ or "") + "\n\nKeyword options:\n\n"
                        + "\n".join(f"- ``{f.name}``{_default(f)}: {f.metadata['doc']}" for f in taken))
        return call  # type: ignore[return-value]

    return wrap


def _default(option: Field[Any]) -> str:
    return "" if option.default is MISSING else f" (default ``{option.default!r}``)"
