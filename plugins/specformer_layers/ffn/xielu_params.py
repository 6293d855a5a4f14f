"""The settings of the learned activations an MLP may name by kind, importable without torch."""

from __future__ import annotations

import math

from pydantic import Field, model_validator

from specformer.registry.params import Params, Sized


class XIELUParams(Params):
    """xIELU, the expanded integral of ELU, with two learned scalars (Huang et al. 2024, arXiv:2411.13010).

    ``f(x) = a_p x^2 + beta x`` for ``x > 0`` and ``a_n (expm1(min(x, eps)) - x) + beta x``
    otherwise, with ``a_p = softplus(alpha_p)`` and ``a_n = beta + softplus(alpha_n)``: the
    positive side grows quadratically at a learned rate, the negative side's slope runs from
    ``beta`` to ``beta - a_n`` and is learned too. The two raw scalars are the parameters
    (one pair per layer); ``alpha_p_init`` and ``alpha_n_init`` are ``a_p`` and ``a_n`` at
    initialisation. ``eps`` (slightly below 0) keeps ``expm1`` off exactly 0 for the
    gradient. Apertus uses it in its ungated MLPs, with the defaults here.
    """

    alpha_p_init: float = Field(default=0.8, gt=0, description="a_p = softplus(alpha_p) at initialisation.")
    alpha_n_init: float = Field(default=0.8, gt=0, description="a_n = beta + softplus(alpha_n) at initialisation "
                                                              "(must exceed beta).")
    beta: float = Field(default=0.5, description="The linear term beta * x on both sides.")
    eps: float = Field(default=-1e-6, le=0, description="The negative side reads expm1(min(x, eps)).")

    @model_validator(mode="after")
    def _reachable(self) -> "XIELUParams":
        if self.alpha_n_init <= self.beta:
            raise ValueError(f"alpha_n_init ({self.alpha_n_init}) must exceed beta ({self.beta}): "
                             "a_n = beta + softplus(alpha_n) is always above beta")
        return self

    def raw_alphas(self) -> tuple[float, float]:
        """The raw parameters (alpha_p, alpha_n) that give ``alpha_p_init`` and ``alpha_n_init``: softplus inverted."""
        return (math.log(math.expm1(self.alpha_p_init)), math.log(math.expm1(self.alpha_n_init - self.beta)))

    def sized(self) -> Sized:
        return Sized(parameters=2)
