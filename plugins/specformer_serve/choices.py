"""One choice of a response: its tokens become text, cut at the first stop string, streamed safely.

The engine hands over tokens; text is the tokenizer's decoding of all of them so far (a
token may complete a character the previous one started). A stop string ends the choice
and is not part of its text (OpenAI's rule). While streaming, text that could still turn
out to be the start of a stop string, or an unfinished UTF-8 character (``U+FFFD`` at
the end), is held back until the next token settles it, so a client never receives text
it would have to take back.

A chat choice also ends at its template's end-of-turn marker (:mod:`.chat_template`): a
marker that is one token is an eos id to the engine and one of the choice's ``hidden``
ids, which are never part of its text (a tokenizer may decode an added token as text); a
marker spelled with several tokens is one more stop string.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specformer_serve.engine import EndEvent, Handle, PromptEvent, TokenEvent


@dataclass
class Choice:
    index: int
    prompt: list[int]
    tokenizer: Any
    stops: list[str]
    handle: Handle | None = None
    hidden: frozenset[int] = frozenset()  # end-of-turn token ids: they end the choice and are not in its text
    tokens: list[int] = field(default_factory=list)
    logprobs: list[TokenEvent] = field(default_factory=list)
    prompt_logprobs: list[TokenEvent] | None = None  # the prompt's tokens scored by the prefill (echo with logprobs)
    text: str = ""  # the text so far, cut at a stop string when one was found
    sent: str = ""  # what a stream has delivered already
    finish_reason: str | None = None  # stop, length; set once the choice is over
    error: str | None = None
    streamed_logprobs: int = 0  # how many logprob entries a stream has delivered
    streamed_tokens: int = 0  # how many token ids a stream has delivered (return_token_ids)
    ended: bool = False  # a stream has sent this choice's finish_reason
    echoed: bool = False  # a stream has sent the prompt's text (echo)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None or self.error is not None

    def feed(self, event: Any) -> None:
        """Take one engine event (the scored prompt, a token or the end)."""
        if isinstance(event, PromptEvent):
            self.prompt_logprobs = list(event.tokens)
            return
        if isinstance(event, EndEvent):
            if event.reason == "error":
                self.error = event.message or "generation failed"
            elif self.finish_reason is None:
                self.finish_reason = "stop" if event.reason in ("stop", "cancelled") else event.reason
            return
        if self.done:
            return  # tokens already on their way when a stop string ended the choice
        self.tokens.append(event.token)
        if event.logprob is not None:
            self.logprobs.append(event)
        visible = self.tokens[:-1] if event.token in self.hidden else self.tokens
        text = decode(self.tokenizer, visible)
        cut = _first_stop(text, self.stops)
        if cut is not None:
            self.text = text[:cut]
            self.finish_reason = "stop"
            if self.handle is not None:
                self.handle.cancel()  # frees its blocks now rather than after max_tokens
        else:
            self.text = text

    def delta(self) -> str:
        """New text a stream may send now (nothing that a later token could still change)."""
        ready = self.text if self.done else _settled(self.text, self.stops)
        if not ready.startswith(self.sent) or len(ready) <= len(self.sent):
            return ""
        piece = ready[len(self.sent):]
        self.sent = ready
        return piece


def decode(tokenizer: Any, tokens: list[int]) -> str:
    """Text of ``tokens``; a checkpoint without a tokenizer gives none (its clients read token ids)."""
    if getattr(tokenizer, "kind", None) == "none":
        return ""
    return tokenizer.decode(tokens)


def _first_stop(text: str, stops: list[str]) -> int | None:
    found = [text.find(stop) for stop in stops if stop in text]
    return min(found) if found else None


def _settled(text: str, stops: list[str]) -> str:
    """``text`` without a trailing partial character or a tail that may begin a stop string."""
    end = len(text)
    while end and text[end - 1] == "\ufffd":
        end -= 1
    for stop in stops:
        for size in range(min(len(stop) - 1, end), 0, -1):
            if text[:end].endswith(stop[:size]):
                end = min(end, len(text[:end]) - size)
                break
    return text[:end]
