"""The CTRL repetition penalty (Keskar et al. 2019)."""

from __future__ import annotations

import torch
from torch import Tensor

from specformer_generate.samplers.params import RepetitionPenaltyParams
from specformer_generate.samplers.history import token_seen


class RepetitionPenalty:
    """Make every token already in the sequence (prompt included) less likely, once per token.

    Its settings and the rule in full: :class:`RepetitionPenaltyParams`.
    """

    Params = RepetitionPenaltyParams

    def __init__(self, params: RepetitionPenaltyParams) -> None:
        self.penalty = float(params.penalty)

    def __call__(self, logits: Tensor, input_ids: Tensor) -> Tensor:
        seen = token_seen(input_ids, logits.shape[-1])
        penalised = torch.where(logits < 0, logits * self.penalty, logits / self.penalty)
        return torch.where(seen, penalised, logits)

    def __repr__(self) -> str:
        return f"repetition_penalty(penalty={self.penalty})"
