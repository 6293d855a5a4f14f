"""Cutting a token sequence into the windows a model of limited context can score.

A sequence ``tokens`` is scored from its second token on: ``tokens[0]`` is context only
(the end-of-text token that starts every document, as in training data, or the first
id of a tokenized array). Each window holds at most ``context`` input tokens; the first
scores every target it sees, and each later one moves ``stride`` tokens on and scores
only the targets no earlier window scored. So every token is scored exactly once, and
with at least ``context - stride`` tokens before it in its window (the Hugging Face
perplexity guide's sliding window; ``stride = context`` gives disjoint windows, and the
last window is still filled back to a full context, as lm-evaluation-harness does).

::

    tokens   e a b c d e f g h      context 4, stride 2
    window 1 e a b c d              scores a b c d
    window 2     b c d e f          scores       e f
    window 3         d e f g h      scores           g h
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence


@dataclass(frozen=True)
class Window:
    """``tokens``: the inputs followed by the last target (``len = inputs + 1``); the last ``scored``
    targets (``tokens[-scored:]``) are the ones this window scores. ``tag`` says whose window it is."""

    tokens: Sequence[int]
    scored: int
    tag: Any = None

    @property
    def inputs(self) -> int:
        return len(self.tokens) - 1


def check_window_sizes(*, context: int, stride: int, limit: int | None) -> None:
    """ValueError unless ``1 <= stride <= context <= limit`` (the model's context length; None: no limit)."""
    if context < 1 or (limit is not None and context > limit):
        raise ValueError(f"context must be between 1 and the model's context length {limit}, got {context}")
    if stride < 1 or stride > context:
        raise ValueError(f"stride must be between 1 and the context ({context}), got {stride}")


def sliding_windows(tokens: Sequence[int], *, context: int, stride: int, tag: Any = None) -> Iterator[Window]:
    """The windows that score ``tokens[1:]`` once each (see the module doc); none for fewer than 2 tokens."""
    if context < 1 or not 1 <= stride <= context:
        raise ValueError(f"need 1 <= stride <= context, got context {context}, stride {stride}")
    targets = len(tokens) - 1
    if targets < 1:
        return
    scored_until = 0  # targets 1..scored_until are done
    end = min(context, targets)  # this window's last target
    while True:
        start = max(0, end - context)  # its first input
        yield Window(tokens=tokens[start : end + 1], scored=end - scored_until, tag=tag)
        if end == targets:
            return
        scored_until = end
        end = min(end + stride, targets)
