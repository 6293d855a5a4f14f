"""A conversation with one model: text goes in turn by turn, and the KV cache is kept between turns.

``generate`` starts from an empty cache every call, so a chat that called it on the
whole history each turn would recompute the history every time. A :class:`Session`
owns one cache of the model's whole context and only ever runs tokens it has not seen:

::

    session = Session(model, eos_token_id=256)
    session.append(tokenizer.encode("Hello\n"))
    reply = list(session.reply(max_new_tokens=50))     # runs "Hello\n" once, then one token a step
    session.append(tokenizer.encode("And then?\n"))
    reply = list(session.reply(max_new_tokens=50))     # runs only the last reply token and the new turn

The last token of a reply is kept pending (it was drawn from the logits of the one
before it) and runs through the model with the next turn. A reply ends after an eos
token, after ``max_new_tokens``, when the context is full, or when the caller stops
iterating (a stop string found in the text, say).
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import torch

from specformer_generate import arguments
from specformer_generate.cache import StaticKVCache
from specformer_generate.arguments import check_mode
from specformer_generate.memory import check_generation_memory, estimate
from specformer_generate.samplers.pipeline import build_sampler


class Session:
    """One conversation with ``model``: ``append`` tokens, then iterate ``reply`` for the next ones."""

    def __init__(self, model: Any, *, sampler: Any = None, seed: int | None = None,
                 eos_token_id: int | Sequence[int] | None = None, max_memory: int | str | None = None) -> None:
        self.model = model
        self.context_length = int(model.context_length)
        self.sampler = build_sampler(sampler)
        self.eos = set(arguments.eos_ids(eos_token_id))
        seed = arguments.seed(seed)
        self.device = next(model.parameters()).device
        self.generator = torch.Generator(device=self.device).manual_seed(seed) if seed is not None else None
        need = estimate(model, rows=1, width=self.context_length, new_tokens=0)
        check_generation_memory(need, device=self.device, max_memory=max_memory, what="a chat session")
        self.cache = StaticKVCache.for_model(model, batch_size=1, capacity=self.context_length)
        self.tokens: list[int] = []  # every token of the conversation, in order
        self._run_upto = 0  # tokens[:_run_upto] are in the cache; the rest are pending
        self.tokens_run = 0  # tokens run through the model so far (each exactly once)

    @property
    def room(self) -> int:
        """Tokens that still fit in the context."""
        return self.context_length - len(self.tokens)

    def append(self, ids: Sequence[int]) -> None:
        """Add tokens (a user's turn) to the conversation; they run with the next reply."""
        ids = list(ids)
        if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < self.model.vocab_size for i in ids):
            raise ValueError(f"a turn must be token ids in [0, {self.model.vocab_size}), got {ids!r:.80}")
        if len(ids) > self.room:
            raise ValueError(f"the turn ({len(ids)} tokens) does not fit: {self.room} of the model's "
                             f"{self.context_length}-token context are left; call reset() to start over")
        self.tokens += ids

    def reset(self) -> None:
        """Forget the conversation (the cache's memory stays allocated)."""
        self.cache.reset()
        self.tokens.clear()
        self._run_upto = 0

    def reply(self, *, max_new_tokens: int) -> Iterator[int]:
        """Yield the next tokens one by one until an eos token, ``max_new_tokens`` or a full context."""
        arguments.positive_int("max_new_tokens", max_new_tokens)
        if not self.tokens:
            raise ValueError("append a turn before asking for a reply: the session is empty")
        check_mode(self.model)
        for _ in range(min(max_new_tokens, self.room)):
            with torch.inference_mode():
                logits = self._run_pending()
                history = torch.tensor([self.tokens], device=self.device)  # (1, T) what history samplers read
                token = int(self.sampler.sample(logits, history, self.generator)[0])
            self.tokens.append(token)
            yield token
            if token in self.eos:
                return

    def _run_pending(self) -> torch.Tensor:
        """Run the tokens not yet in the cache; next-token logits ``(1, vocab)``."""
        start, end = self._run_upto, len(self.tokens)
        ids = torch.tensor([self.tokens[start:end]], device=self.device)  # (1, T)
        positions = torch.arange(start, end, device=self.device)[None]  # (1, T)
        logits = self.model(ids, positions=positions, cache=self.cache, last_only=True)[:, -1].float()
        self._run_upto = end
        self.tokens_run += end - start
        return logits
