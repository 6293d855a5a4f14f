"""OpenAI's frequency and presence penalties.

Both subtract from the logit of tokens already in the sequence (prompt included):
``z_j - c_j * frequency - (c_j > 0) * presence`` with ``c_j`` the number of times token
``j`` occurs. The frequency penalty grows with every repeat; the presence penalty is paid
once. Positive values discourage repeats, negative ones encourage them. Negative ids
(padding) are not tokens and are not counted.
"""

from __future__ import annotations

from torch import Tensor

from specformer_generate.samplers.params import FrequencyPenaltyParams, PresencePenaltyParams
from specformer_generate.samplers.history import token_counts, token_seen


class FrequencyPenalty:
    """Subtract ``penalty`` times the number of occurrences of each token (:class:`FrequencyPenaltyParams`)."""

    Params = FrequencyPenaltyParams

    def __init__(self, params: FrequencyPenaltyParams) -> None:
        self.penalty = float(params.penalty)

    def __call__(self, logits: Tensor, input_ids: Tensor) -> Tensor:
        counts = token_counts(input_ids, logits.shape[-1], dtype=logits.dtype)
        return logits - counts * self.penalty

    def __repr__(self) -> str:
        return f"frequency_penalty(penalty={self.penalty})"


class PresencePenalty:
    """Subtract ``penalty`` once from every token that occurred at all (:class:`PresencePenaltyParams`)."""

    Params = PresencePenaltyParams

    def __init__(self, params: PresencePenaltyParams) -> None:
        self.penalty = float(params.penalty)

    def __call__(self, logits: Tensor, input_ids: Tensor) -> Tensor:
        seen = token_seen(input_ids, logits.shape[-1])
        return logits - seen.to(logits.dtype) * self.penalty

    def __repr__(self) -> str:
        return f"presence_penalty(penalty={self.penalty})"
