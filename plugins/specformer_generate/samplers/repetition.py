"""The CTRL repetition penalty (Keskar et al. 2019)."""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from specformer.registry.params import Params
from specformer_generate.samplers.history import token_seen


class RepetitionPenalty:
    """Make every token already in the sequence (prompt included) less likely, once per token.

    A seen token's logit ``z`` becomes ``z / penalty`` when positive and ``z * penalty``
    when negative, so ``penalty > 1`` discourages repeats and ``penalty < 1`` encourages
    them; how often the token occurred does not matter. Negative ids (padding) are ignored.
    """

    class Params(Params):
        penalty: float = Field(gt=0, description="> 1 discourages repeats, < 1 encourages them, 1 does nothing.")

    def __init__(self, *, penalty: float) -> None:
        if not penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {penalty}")
        self.penalty = float(penalty)

    @classmethod
    def from_params(cls, params: Params) -> "RepetitionPenalty":
        return cls(penalty=params.penalty)

    def __call__(self, logits: Tensor, input_ids: Tensor) -> Tensor:
        seen = token_seen(input_ids, logits.shape[-1])
        penalised = torch.where(logits < 0, logits * self.penalty, logits / self.penalty)
        return torch.where(seen, penalised, logits)

    def __repr__(self) -> str:
        return f"repetition_penalty(penalty={self.penalty})"
