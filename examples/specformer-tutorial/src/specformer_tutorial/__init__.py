"""A specformer plugin: the DyT norm, eta sampling and the ``specformer dyt-swap`` command."""

from specformer_tutorial.dyt import DyT
from specformer_tutorial.eta import EtaSampling

__all__ = ["DyT", "EtaSampling"]
