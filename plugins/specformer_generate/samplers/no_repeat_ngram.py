"""Forbid repeating any n-gram (Paulus et al. 2017; fairseq's ``no_repeat_ngram_size``)."""

from __future__ import annotations

import torch
from torch import Tensor

from specformer_generate.samplers.params import NoRepeatNGramParams
from specformer_generate.samplers.history import spare_column_ids


class NoRepeatNGram:
    """Ban every token that would complete an ``n``-gram already present in the sequence.

    Its settings and the rule in full: :class:`NoRepeatNGramParams`.
    """

    Params = NoRepeatNGramParams

    def __init__(self, params: NoRepeatNGramParams) -> None:
        self.n = params.n

    def __call__(self, logits: Tensor, input_ids: Tensor) -> Tensor:
        length = input_ids.shape[-1]
        if length < self.n:
            return logits
        vocab = logits.shape[-1]
        prefix = input_ids[:, length - self.n + 1 :]  # (B, n-1): what the next token would extend
        # Every n-gram but the one starting at the prefix itself (it has no last token yet).
        grams = input_ids.unfold(1, self.n, 1)  # (B, T-n+1, n)
        matches = (grams[..., :-1] == prefix[:, None, :]).all(dim=-1)  # (B, T-n+1)
        followers = spare_column_ids(grams[..., -1], vocab)
        followers = torch.where(matches, followers, vocab)
        banned = torch.zeros(logits.shape[0], vocab + 1, dtype=torch.bool, device=logits.device)
        banned.scatter_(1, followers, True)
        return logits.masked_fill(banned[:, :vocab], float("-inf"))

    def __repr__(self) -> str:
        return f"no_repeat_ngram(n={self.n})"
