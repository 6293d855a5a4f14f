"""The drafters of speculative decoding: prompt lookup, a smaller model, and the model's own MTP depths.

``PromptLookup`` (Saxena 2023, "prompt lookup decoding") finds the most recent earlier
occurrence of the text's last ``n`` tokens (``n`` from ``max_ngram`` down to 1) and
proposes the ``k`` tokens that followed it: free, and good on text that repeats its input
(code edits, extraction, summaries quoting the source) or itself (a loop: when the
occurrence is so recent that fewer than ``k`` tokens follow it, the text is taken to
repeat with that period and the copy goes on over the drafts themselves).

``DraftModel`` runs another specformer model with the same vocabulary one token at a
time with its own KV cache, drawing each draft with the same sampler as the target (so
its ``q`` is close to the target's ``p`` and most drafts are accepted).

``MTPDrafter`` (self-speculative decoding) drafts with the model's own multi-token
prediction depths (``model.mtp``, DeepSeek-V3 section 2.2), which were trained to predict
the tokens after the next one from its hidden state.
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

#: Positions the MTP drafter's depth block reads (it runs without a cache, over the last this many).
MTP_WINDOW = 32


def _draw(sampler: Sampler, logits: Tensor, context: Tensor, generator: torch.Generator | None,
          probs: list[Tensor]) -> Tensor:
    """The drafted token ``(B,)`` for ``logits`` ``(B, V)`` as ``sampler`` picks it after reading ``context``;
    when it samples, the distribution it drew from is appended to ``probs`` (the verifier's ``q``)."""
    processed = sampler.process(logits, context)
    if sampler.is_greedy:
        return processed.argmax(dim=-1)
    p = probabilities(processed)  # (B, V)
    probs.append(p)
    return sample_from(p, generator)


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
            token = _draw(sampler, logits, context[:, : filled + j], generator, probs)
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


class MTPDrafter:
    """Drafts with the model's multi-token prediction depths, from the hidden states of its own forwards.

    Column ``i = filled - 2`` is the last one whose successor (column ``filled - 1``, the token
    the round just emitted) is final; the model's hidden state there, ``h_i`` (before its final
    norm), and the embedding of that token give depth 1's logits for the first draft. Draft
    ``m`` runs depth ``min(m, D)`` on the previous step's output ``h^{m-1}`` and the embedding
    of draft ``m - 1``: the first ``D`` drafts use depths 1..D in order, each as it was trained
    (depth k reads ``h^{k-1}`` and the token k ahead), and past ``D`` the last depth is chained
    on its own output, as inference engines do when they draft more tokens than there are
    depths (for a one-depth model, DeepSeek-V3 or GLM-4.5: depth 1 chained).

    A depth's block runs without a cache over the last ``window`` columns (``MTP_WINDOW``):
    its attention sees at most that many positions back, which may lower acceptance on long
    texts but never changes the output (every draft is checked by the model). Columns of
    left padding have negative positions and are never attended to.
    """

    reads_hidden = True

    def __init__(self, model: Any, *, window: int = MTP_WINDOW) -> None:
        if model.mtp is None:
            raise ValueError("MTPDrafter needs a model with MTP depths (model.mtp)")
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        self.model = model
        self.window = window
        self.hidden: Tensor | None = None  # (B, capacity, D): the model's hidden state at each column it read
        self.capacity = 0  # columns of the call (prompt width plus new tokens), set by start

    def start(self, batch: PromptBatch, *, capacity: int, spare: int) -> None:
        self.hidden = None  # sized and typed by the first read_hidden (the prefill's)
        self.capacity = capacity

    def read_hidden(self, hidden: Tensor, column: int) -> None:
        if self.hidden is None:
            self.hidden = hidden.new_zeros((hidden.shape[0], self.capacity, hidden.shape[-1]))
        self.hidden[:, column : column + hidden.shape[1]] = hidden

    def propose(self, tokens: Tensor, history: Tensor, filled: int, k: int, *, offsets: Tensor, sampler: Sampler,
                generator: torch.Generator | None) -> Draft | None:
        assert self.hidden is not None
        model, depths = self.model, len(self.model.mtp)
        last = filled - 2  # the last column whose hidden state and successor are final
        first = max(last - self.window + 1, 0)
        columns = torch.arange(first, last + 1, device=tokens.device)  # (W,)
        positions = columns[None, :] - offsets  # (B, W): negative in padding columns
        sequence = tokens[:, : filled + k].clone()  # (B, filled + k): the text, then the drafts as they come
        context = history[:, : filled + k].clone()  # what the sampler reads, drafts included
        hidden = self.hidden[:, first : last + 1]  # (B, W, D): h^0
        drafted, probs = [], []
        for m in range(1, k + 1):
            depth = min(m, depths)
            ahead = sequence[:, first + m : last + 1 + m]  # (B, W): the token m columns ahead of each row
            hidden = model.mtp_depth(depth, hidden, ahead, positions=positions)  # (B, W, D): h^m
            logits = model.output_logits(model.mtp[depth - 1].final_norm(hidden[:, -1:]))[:, -1].float()  # (B, V)
            token = _draw(sampler, logits, context[:, : filled + m - 1], generator, probs)
            drafted.append(token)
            sequence[:, filled + m - 1] = token
            context[:, filled + m - 1] = token
        proposed = torch.stack(drafted, dim=1)  # (B, k)
        return Draft(tokens=proposed, valid=torch.ones_like(proposed, dtype=torch.bool),
                     probs=torch.stack(probs, dim=1) if probs else None)

    def keep(self, columns: int) -> None:
        pass  # the hidden states of rejected columns are written again when the model reads them
