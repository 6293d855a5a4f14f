"""A sampler: the processors of a spec's ``generate.sampler`` list, run in order, then a choice.

Each entry of the list is a registered component of kind ``sampler``: a callable
``(logits (B, V), input_ids (B, T)) -> logits`` that rescales logits or sets filtered
entries to ``-inf``. An entry may also choose the token itself (``choose(logits,
generator) -> (B,)``, as ``greedy`` does); it must then be the last. Without such an
entry the next token is drawn from ``softmax(processed logits)``.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import torch
from pydantic import ValidationError
from torch import Generator, Tensor

from specformer.errors import Problem, SpecError, UnknownComponentError, excerpt
from specformer.messages import join_path
from specformer.registry.params import as_component_ref
from specformer.registry.discovery import get_registry
from specformer.registry.components import Resolved
from specformer.spec import problems_from_validation_error
from specformer_generate.samplers.greedy import Greedy
from specformer_generate.samplers.params import check_chooser_last, check_constraint_first

LogitsStep = Callable[[Tensor, Tensor], Tensor]


class Sampler:
    """Processors applied in order, then a draw (or the last step's own choice).

    ``process(logits, input_ids)`` returns the processed logits; ``sample(logits,
    input_ids, generator)`` returns the next token of every row ``(B,)``. In
    ``input_ids`` negative ids mark padding and are ignored by every built-in step.
    """

    def __init__(self, steps: Sequence[LogitsStep] = (), *, greedy_default: bool = False) -> None:
        steps = list(steps)
        check_chooser_last((repr(step), _chooses(step)) for step in steps)
        check_constraint_first((repr(step), _constrains(step)) for step in steps)
        self.steps = steps
        self.chooser = steps[-1] if steps and _chooses(steps[-1]) else None
        self.greedy_default = greedy_default

    @property
    def is_greedy(self) -> bool:
        """True when the next token is the argmax of the processed logits (no randomness)."""
        return isinstance(self.chooser, Greedy) or (self.chooser is None and self.greedy_default)

    @property
    def constrained(self) -> bool:
        """True when a step allows only what a grammar accepts (:mod:`specformer_generate.samplers.constraint`)."""
        return any(_constrains(step) for step in self.steps)

    def for_run(self, *, tokenizer: Any, vocab_size: int, eos: Sequence[int], prompt_width: int) -> "Sampler":
        """This sampler for one generation call: each constraint bound to the call, the other steps as they are.

        A constraint keeps per-row state for the call, so the sampler itself stays reusable
        (and shareable between threads); without a constraint it is returned unchanged.
        """
        if not self.constrained:
            return self
        steps = [step.for_run(tokenizer=tokenizer, vocab_size=vocab_size, eos=eos, prompt_width=prompt_width)
                 if _constrains(step) else step for step in self.steps]
        bound = Sampler.__new__(Sampler)
        bound.steps, bound.chooser, bound.greedy_default = steps, self.chooser, self.greedy_default
        return bound

    def process(self, logits: Tensor, input_ids: Tensor) -> Tensor:
        """Apply every step in order: ``(B, V), (B, T) -> (B, V)``."""
        if logits.dim() != 2:
            raise ValueError(f"logits must be (batch, vocab), got shape {tuple(logits.shape)}")
        if input_ids.dim() != 2 or input_ids.shape[0] != logits.shape[0]:
            raise ValueError(
                f"input_ids must be (batch, time) with batch {logits.shape[0]}, got shape {tuple(input_ids.shape)}"
            )
        if not self.steps:
            return logits
        # A filtered token (-inf) stays impossible whatever a later step does to it (a
        # processor that rescales -inf into NaN, say), and a NaN is never a token to draw.
        filtered = torch.isneginf(logits)
        for step in self.steps:
            logits = step(logits, input_ids)
            filtered |= torch.isneginf(logits) | torch.isnan(logits)
        return logits.masked_fill(filtered, float("-inf"))

    def choose(self, processed: Tensor, generator: Generator | None = None) -> Tensor:
        """The next token of every row from already processed logits ``(B, V) -> (B,)``."""
        if self.chooser is not None:
            return self.chooser.choose(processed, generator)
        return processed.argmax(dim=-1) if self.greedy_default else draw(processed, generator)

    def sample(self, logits: Tensor, input_ids: Tensor, generator: Generator | None = None) -> Tensor:
        """Process, then choose: the next token of every row ``(B,)``."""
        return self.choose(self.process(logits, input_ids), generator)

    def __repr__(self) -> str:
        choice = "" if self.chooser is not None else (" -> argmax" if self.greedy_default else " -> draw")
        return f"Sampler([{', '.join(repr(s) for s in self.steps)}]{choice})"


def draw(processed: Tensor, generator: Generator | None = None) -> Tensor:
    """One token per row, drawn with probability ``softmax(processed)``.

    NaN logits count as ``-inf`` (never drawn); when a row has ``+inf`` logits, one of
    those is drawn uniformly. Uses the exponential race: ``argmax(p_i / E_i)`` with ``E_i ~ Exp(1)`` picks ``i``
    with probability ``p_i`` (it is the Gumbel-max trick in another form) and, unlike
    ``torch.multinomial``, never waits for the device.
    """
    processed = processed.float().nan_to_num(nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))
    # A logit of +inf is certain: draw among those (softmax alone would give NaN for the row).
    certain = torch.isposinf(processed)
    processed = torch.where(certain.any(dim=-1, keepdim=True), torch.where(certain, 0.0, float("-inf")), processed)
    probs = torch.softmax(processed, dim=-1)
    race = torch.empty_like(probs).exponential_(1.0, generator=generator)
    return (probs / race).argmax(dim=-1)


def _chooses(step: Any) -> bool:
    return callable(getattr(step, "choose", None))


def _constrains(step: Any) -> bool:
    return callable(getattr(step, "for_run", None))


def greedy() -> Sampler:
    """Argmax decoding with no processors (what ``sampler=None`` means)."""
    return Sampler((), greedy_default=True)


def build_sampler(entries: "Sampler | Iterable[Any] | None", *, registry: Any = None, path: str = "sampler") -> Sampler:
    """A :class:`Sampler` from a list of sampler components, as written in a spec's ``generate.sampler``.

    Entries are ``{"kind": name, **params}`` mappings, bare names (``"greedy"``) or
    already resolved components. ``None`` is greedy decoding; an empty list draws from
    the model's distribution unchanged. Raises :class:`~specformer.errors.SpecError`
    naming every bad entry (``sampler[1].p: ...``).
    """
    if isinstance(entries, Sampler):
        return entries
    if entries is None:
        return greedy()
    if isinstance(entries, (str, dict)):
        # excerpt(): a value sharing its parts (2**40 items in a few kB) is quoted without walking it (found by fuzzing).
        raise SpecError([Problem(path, f"expected a list of sampler components, got {type(entries).__name__} {excerpt(entries)}")])
    if not isinstance(entries, (list, tuple)):
        raise SpecError([Problem(path, f"expected a list of sampler components, got {type(entries).__name__} "
                                       f"{excerpt(entries, 60)}")])
    registry = registry if registry is not None else get_registry()
    steps: list[LogitsStep] = []
    problems: list[Problem] = []
    for i, entry in enumerate(entries):
        where = join_path(path, [i])
        if isinstance(entry, Resolved):
            steps.append(entry.make())
            continue
        try:
            ref = as_component_ref(entry)
            resolved = registry.resolve("sampler", ref)
        except ValidationError as exc:
            params = registry.get("sampler", ref["kind"]).params
            problems += problems_from_validation_error(exc, prefix=where, model=params)
            continue
        except UnknownComponentError as exc:
            problems.append(Problem(join_path(where, ["kind"]), str(exc)))
            continue
        except ValueError as exc:  # not a component reference: a number, a nested list...
            problems.append(Problem(where, str(exc)))
            continue
        try:
            steps.append(resolved.make())
        except ValueError as exc:  # a constraint whose grammar does not compile
            problems.append(Problem(where, str(exc)))
    if problems:
        raise SpecError(problems)
    try:
        return Sampler(steps)
    except ValueError as exc:
        raise SpecError([Problem(path, str(exc))]) from None
