"""Greedy choice: the likeliest token after every processor has run."""

from __future__ import annotations

from torch import Generator, Tensor

from specformer_generate.samplers.params import GreedyParams


class Greedy:
    """Choose the token with the largest processed logit instead of drawing one.

    Its settings (none) and the rule in full: :class:`GreedyParams`.
    """

    Params = GreedyParams

    def __init__(self, params: GreedyParams | None = None) -> None:
        pass  # nothing to set: the choice is the argmax

    def __call__(self, logits: Tensor, input_ids: Tensor) -> Tensor:
        return logits

    def choose(self, logits: Tensor, generator: Generator | None = None) -> Tensor:
        return logits.argmax(dim=-1)

    def __repr__(self) -> str:
        return "greedy"
