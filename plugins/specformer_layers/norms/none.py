"""No normalisation (norm kind ``none``): the identity, for a place that has no norm."""

from __future__ import annotations

from torch import Tensor, nn
from specformer.model.parallel_plan import ParallelPlan

from specformer_layers.norms.params import NoNormParams


class NoNorm(nn.Module):
    """Returns its input unchanged; no weights (:class:`NoNormParams`)."""

    Params = NoNormParams

    def __init__(self, params: NoNormParams | None = None, *, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def parallel_plan(self) -> ParallelPlan:
        """Replicated: nothing to split."""
        return {}

    def forward(self, x: Tensor) -> Tensor:
        return x

    def extra_repr(self) -> str:
        return f"dim={self.dim}"
