"""specformer's built-in layers: positional schemes, norms, feed-forward networks,
attention and block layouts. A plugin like any other (see ``plugin.py``).

Other plugins use the components through the registry, by kind and name; the one rule
they share beyond that is :func:`default_gated_hidden`, the hidden width a gated
feed-forward network takes when a spec leaves it out (the hf plugin writes and reads it).
Names are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "default_gated_hidden": "specformer_layers.ffn.gated",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'specformer_layers' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
