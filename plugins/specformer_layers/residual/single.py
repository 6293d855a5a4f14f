"""The one residual stream every block adds to (the default; no weights)."""

from __future__ import annotations

from specformer.model.residual import ResidualStream
from specformer_layers.residual.params import SingleStreamParams


class SingleStream(ResidualStream):
    """One stream: ``x = x + f(x)`` around each sublayer (:class:`SingleStreamParams`)."""

    Params = SingleStreamParams

    def __init__(self, params: SingleStreamParams | None = None) -> None:
        super().__init__()
