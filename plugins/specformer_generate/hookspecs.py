"""The hooks the generate plugin declares for other plugins.

Added to the plugin manager when the plugin is registered (its
``specformer_add_hookspecs``), so they exist only where the generate plugin is installed.
Implement one with ``specformer.hookimpl``.
"""

from __future__ import annotations

import pluggy

from specformer.registry.hookspecs import PROJECT

hookspec = pluggy.HookspecMarker(PROJECT)


@hookspec
def specformer_on_generate_end(tokens: int, seconds: float) -> None:
    """After a ``generate`` call: the number of new tokens and the wall time it took."""


__all__ = ["specformer_on_generate_end"]
