"""What a continuation shows as text: cut at the first stop string or end-of-turn marker.

``generate`` (printing a whole continuation or a stream) and ``chat`` (a reply as it
grows) show the same text for the same tokens; both cut here.
"""

from __future__ import annotations

from specformer.tokenizers.tokenizer import Tokenizer
from specformer_text import TurnEnd


def continuation_text(tokenizer: Tokenizer, new: list[int], stops: list[str],
                      turn_end: TurnEnd | None = None) -> tuple[str, bool]:
    """The decoded continuation, cut just after the first stop string it contains, or just before the first
    end-of-turn marker of ``turn_end`` (a :class:`specformer_text.TurnEnd`); and whether either was found."""
    if turn_end is not None:
        new = turn_end.visible(new)
    text = tokenizer.decode(new)
    ends = [text.find(stop) + len(stop) for stop in stops if stop in text]
    if turn_end is not None:
        ends += [text.find(marker) for marker in turn_end.strings if marker in text]
    return (text[: min(ends)], True) if ends else (text, False)


def shown_so_far(tokenizer: Tokenizer, new: list[int], stops: list[str], turn_end: TurnEnd | None = None) -> tuple[str, bool]:
    """What a stream may print of the continuation ``new`` now: cut as :func:`continuation_text` cuts, less a
    tail that may still become an end-of-turn marker or is half a character; and whether it ended."""
    text, ended = continuation_text(tokenizer, new, stops, turn_end)
    if ended:
        return text, True
    if turn_end is not None:
        text = turn_end.settled(text)
    return text.rstrip("\ufffd"), False
