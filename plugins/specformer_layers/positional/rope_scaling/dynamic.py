"""Dynamic NTK-aware RoPE scaling (bloc97 and emozilla, 2023; as in transformers' ``dynamic``)."""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from specformer.registry.params import Params
from specformer_layers.positional.fp32 import rope_exponents
from specformer_layers.positional.rope_scaling.base import RopeScaling, check_factor


class DynamicNTKScaling(RopeScaling):
    """Raise theta with the sequence length once it passes the trained context, leaving shorter ones alone.

    For a forward pass whose longest position is ``L - 1`` with ``L > original_context_length``
    (``C``), theta becomes ``theta * (factor * L / C - (factor - 1)) ^ (d / (d - 2))`` with
    ``d`` = rotary_dim; for ``L <= C`` the frequencies are RoPE's own. ``L`` is taken over
    the whole batch of the forward pass, so every token of a length-``T`` forward is rotated
    as in one of length ``T``.

    Under a KV cache the keys of earlier steps stay rotated with the frequencies of the
    step that wrote them, while new queries use the current length's: the same thing
    transformers does (it caches rotated keys too), and the reason generation with dynamic
    scaling differs slightly from one full forward over the same tokens.
    """

    length_dependent = True
    keeps_adapting = True

    class Params(Params):
        factor: float = Field(gt=0, description="Scaling strength: at length factor * C theta grows by factor^(d/(d-2)).")
        original_context_length: int | None = Field(
            default=None, gt=0,
            description="Length C up to which frequencies are left unchanged; default the model's context_length "
                        "(transformers' max_position_embeddings).",
        )

    def __init__(self, *, rotary_dim: int, theta: float, factor: float, original_context_length: int) -> None:
        super().__init__(rotary_dim=rotary_dim, theta=theta)
        check_factor("dynamic rope scaling", factor)
        if rotary_dim <= 2:
            raise ValueError(f"dynamic rope scaling needs rotary_dim > 2 (its exponent is d/(d-2)), got {rotary_dim}")
        self.factor = factor
        self.original_context_length = original_context_length
        self.register_table("exponents", rope_exponents(rotary_dim))

    @classmethod
    def from_params(cls, params: Params, *, rotary_dim: int, theta: float, context_length: int) -> "DynamicNTKScaling":
        return cls(rotary_dim=rotary_dim, theta=theta, factor=params.factor,
                   original_context_length=params.original_context_length or context_length)

    def frequencies(self, seq_len: Tensor | None) -> Tensor:
        if seq_len is None:
            seq_len = torch.tensor(self.original_context_length, device=self.exponents.device)
        # A tensor all along: no host sync, and traceable by torch.compile.
        seq_len = seq_len.clamp(min=self.original_context_length)
        d = self.rotary_dim
        stretch = self.factor * seq_len / self.original_context_length - (self.factor - 1)
        base = self.theta * stretch ** (d / (d - 2))
        return 1.0 / (base ** self.exponents)
