"""specformer's generate plugin: samplers, a static KV cache, ``generate``/``stream``, beam search, and
the ``specformer generate`` command.

::

    from specformer_generate import generate
    out = generate(model, [[1, 2, 3], [4, 5]], max_new_tokens=20,
                   sampler=[{"kind": "top_k", "k": 50}, {"kind": "temperature", "value": 0.8}], seed=0)

For a plugin that drives the model itself (a server's scheduler): :class:`Sampler` and
:func:`build_sampler` (a spec's sampler list as one callable), and :func:`checked_seed`
(a request's seed checked as ``generate`` checks it).

Names are imported on first use, so loading the plugin (which every ``specformer`` command
does) imports nothing heavy.
"""

from __future__ import annotations

from specformer.lazy import lazy_exports

_EXPORTS = {
    "GenerateSpec": "specformer_generate.section",
    "LayerShape": "specformer_generate.cache",
    "StaticKVCache": "specformer_generate.cache",
    "Sampler": "specformer_generate.samplers.pipeline",
    "build_sampler": "specformer_generate.samplers.pipeline",
    "Session": "specformer_generate.session",
    "checked_seed": "specformer_generate.arguments:seed",
    "generate": "specformer_generate.generation",
    "stream": "specformer_generate.generation",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
