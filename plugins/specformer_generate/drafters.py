"""The two drafters of speculative decoding: prompt lookup, and a smaller model.

``PromptLookup`` (Saxena 2023, "prompt lookup decoding") finds the most recent earlier
occurrence of the text's last ``n`` tokens (``n`` from ``max_ngram`` down to 1) and
proposes the ``k`` tokens that followed it: free, and good on text that repeats its input
(code edits, extraction, summaries quoting the source) or itself (a loop: when the
occurrence is so recent that fewer than ``k`` tokens follow it, the text is taken to
repeat with that period and the copy goes on over the drafts themselves).

``DraftModel`` runs another specformer model with the same vocabulary one token at a
time with its own KV cache, drawing each draft with the same sampler as the target (so
its ``q`` is close to the target's ``p`` and most drafts are accepted).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from specformer_generate.cache import StaticKVCache
from specformer_generate.decode import prefill
from specformer_generate.inputs import PromptBatch
from specformer_generate.samplers.pipeline import Sampler
from specformer_generate.speculative import Draft, probabilities, sample_from


class PromptLookup:
    """Drafts by copying what followed the last earlier occurrence of the text's final n-gram."""

    def __init__(self, *, max_ngram: int = 3) -> None:
        self.max_ngram = max_ngram
        self.starts: list[int] = []

    def start(self, batch: PromptBatch, *, capacity: int, spare: int) -> None:
        self.starts = [batch.width - length for length in batch.lengths]  # first real column of each row

    def propose(self, tokens: Tensor, history: Tensor, filled: int, k: int, *, offsets: Tensor, sampler: Sampler,
                generator: torch.Generator | None) -> Draft | None:
        rows = tokens.shape[0]
        found: list[list[int]] = []
        for row in range(rows):
            text = tokens[row, self.starts[row] : filled]  # (L,) this row's prompt and output so far
            found.append(self._lookup(text, k))
        longest = max(map(len, found))
        if longest == 0:
            return None  # nothing to propose anywhere: a plain one-token step
        proposed = torch.zeros((rows, longest), dtype=torch.long, device=tokens.device)
        valid = torch.zeros((rows, longest), dtype=torch.bool, device=tokens.device)
        for row, ids in enumerate(found):
            proposed[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            valid[row, : len(ids)] = True
        return Draft(tokens=proposed, valid=valid)

    def _lookup(self, text: Tensor, k: int) -> list[int]:
        length = text.shape[0]
        for n in range(min(self.max_ngram, length - 1), 0, -1):
            tail = text[length - n :]
            windows = text[: length - 1].unfold(0, n, 1)  # (L - n, n): every n-gram that has a successor
            hits = (windows == tail).all(dim=1).nonzero()
            if hits.numel():
                begin = int(hits[-1]) + n  # the most recent occurrence's successor
                follows = text[begin : begin + k].tolist()
                # A match that ends right before the tail (text repeating with period len(follows))
                # has fewer than k successors: the text goes on repeating, so copy on from the
                # drafts themselves (an overlapping copy, as in LZ77). Otherwise text in a loop would
                # be drafted one token a round.
                return [follows[j % len(follows)] for j in range(k)]
        return []

    def keep(self, columns: int) -> None:
        pass  # no state beyond the text itself


class DraftModel:
    """Drafts with a smaller model over the same vocabulary, kept in step with the text by its own cache."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.cache: StaticKVCache | None = None
        self.length = 0  # columns the draft's cache holds

    def start(self, batch: PromptBatch, *, capacity: int, spare: int) -> None:
        self.cache = StaticKVCache.for_model(self.model, batch_size=batch.batch_size, capacity=capacity, spare=spare)
        prefill(self.model, batch.tokens, batch.positions, self.cache)
        self.cache.keep_steps = True  # drafts are rolled back: a recurrent state keeps its steps from here on
        self.length = batch.width

    def propose(self, tokens: Tensor, history: Tensor, filled: int, k: int, *, offsets: Tensor, sampler: Sampler,
                generator: torch.Generator | None) -> Draft | None:
        assert self.cache is not None
        device = tokens.device
        context = history[:, : filled + k].clone()  # (B, filled + k): what the sampler reads, drafts included
        columns = torch.arange(self.length, filled, device=device)  # what the draft has not read yet (1 or 2)
        logits = self._forward(tokens[:, self.length : filled], columns, offsets)
        drafted, probs = [], []
        for j in range(k):
            processed = sampler.process(logits, context[:, : filled + j])
            if sampler.is_greedy:
                token = processed.argmax(dim=-1)  # (B,)
            else:
                p = probabilities(processed)  # (B, V)
                token = sample_from(p, generator)
                probs.append(p)
            drafted.append(token)
            context[:, filled + j] = token
            if j + 1 < k:
                logits = self._forward(token[:, None], columns[-1:] + j + 1, offsets)
        self.length = filled + k - 1
        proposed = torch.stack(drafted, dim=1)  # (B, k)
        return Draft(tokens=proposed, valid=torch.ones_like(proposed, dtype=torch.bool),
                     probs=torch.stack(probs, dim=1) if probs else None)

    def _forward(self, ids: Tensor, columns: Tensor, offsets: Tensor) -> Tensor:
        """Read ``ids`` ``(B, T)`` at ``columns`` ``(T,)``; the draft's float32 logits for the next token."""
        return self.model(ids, positions=columns[None, :] - offsets, cache=self.cache)[:, -1].float()

    def keep(self, columns: int) -> None:
        assert self.cache is not None
        if columns < self.length:
            self.cache.rollback(columns)
            self.length = columns
