"""A specformer plugin: the DyT norm, eta sampling and the ``specformer dyt-swap`` command.

``DyT`` and ``EtaSampling`` are imported on first use: specformer imports this package
for its entry point (``specformer_tutorial.plugin``) whenever it lists components, and
that must not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {"DyT": "specformer_tutorial.dyt", "EtaSampling": "specformer_tutorial.eta"}

__all__ = ["DyT", "EtaSampling"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
