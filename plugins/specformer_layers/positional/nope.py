"""No positional information (NoPE): causal attention alone orders the tokens."""

from __future__ import annotations

from specformer.model.positional import PositionalScheme
from specformer_layers.positional.params import NoPositionsParams


class NoPositions(PositionalScheme):
    """No positional encoding: :class:`NoPositionsParams`."""

    Params = NoPositionsParams

    def __init__(self, params: NoPositionsParams | None = None) -> None:  # no size
        super().__init__()
