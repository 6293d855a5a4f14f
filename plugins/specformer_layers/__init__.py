"""specformer's built-in layers: positional schemes, norms, feed-forward networks,
attention and block layouts. A plugin like any other (see ``plugin.py``).

Other plugins use the components through the registry, by kind and name; the one rule
they share beyond that is :func:`default_gated_hidden`, the hidden width a gated
feed-forward network takes when a spec leaves it out, and :func:`default_dt_rank`, the rank
of Mamba's step when a spec leaves it out (the hf plugin writes and reads both).
Names are imported on first use.
"""

from __future__ import annotations

from specformer.lazy import lazy_exports

_EXPORTS = {
    "default_dt_rank": "specformer_layers.mixers.mamba_params",
    "default_gated_hidden": "specformer_layers.ffn.gated",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
