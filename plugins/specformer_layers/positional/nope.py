"""No positional information (NoPE): causal attention alone orders the tokens."""

from __future__ import annotations

from specformer.registry.params import FromParams, Params
from specformer.model.positional import PositionalScheme


class NoPositions(FromParams, PositionalScheme):
    """No positional encoding at all; the causal mask alone tells order (Kazemnejad et al. 2023)."""

    class Params(Params):
        pass

    def __init__(self) -> None:  # takes no size (nn.Module's own __init__ would take any)
        super().__init__()
