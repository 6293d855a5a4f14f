"""Greedy choice: the likeliest token after every processor has run."""

from __future__ import annotations

from torch import Generator, Tensor

from specformer.registry.params import Params


class Greedy:
    """Choose the token with the largest processed logit instead of drawing one.

    Must be the last entry of a sampler list; the processors before it (repetition
    penalties, n-gram bans) still apply. Among tied logits the lowest id wins.
    """

    class Params(Params):
        pass

    @classmethod
    def from_params(cls, params: Params) -> "Greedy":
        return cls()

    def __call__(self, logits: Tensor, input_ids: Tensor) -> Tensor:
        return logits

    def choose(self, logits: Tensor, generator: Generator | None = None) -> Tensor:
        return logits.argmax(dim=-1)

    def __repr__(self) -> str:
        return "greedy"
