"""No positional information (NoPE): causal attention alone orders the tokens."""

from __future__ import annotations

from specformer.params import Params
from specformer.positional import PositionalScheme


class NoPositions(PositionalScheme):
    """No positional encoding at all; the causal mask alone tells order (Kazemnejad et al. 2023)."""

    class Params(Params):
        pass

    @classmethod
    def from_params(cls, params: Params, *, d_model: int, n_heads: int, head_dim: int, context_length: int) -> "NoPositions":
        return cls()
