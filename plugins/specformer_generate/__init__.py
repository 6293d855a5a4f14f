"""specformer's generate plugin: samplers, a static KV cache, ``generate``/``stream``, beam search, and
the ``specformer generate`` command.

::

    from specformer_generate import generate
    out = generate(model, [[1, 2, 3], [4, 5]], max_new_tokens=20,
                   sampler=[{"kind": "top_k", "k": 50}, {"kind": "temperature", "value": 0.8}], seed=0)

For a plugin that drives the model itself (a server's scheduler): :class:`Sampler` and
:func:`build_sampler` (a spec's sampler list as one callable), and :func:`checked_seed`
(a request's seed checked as ``generate`` checks it).
"""

from __future__ import annotations

from specformer_generate.arguments import seed as checked_seed
from specformer_generate.cache import LayerShape, StaticKVCache
from specformer_generate.generate import generate, stream
from specformer_generate.samplers.pipeline import Sampler, build_sampler
from specformer_generate.section import GenerateSpec
from specformer_generate.session import Session

__all__ = ["GenerateSpec", "LayerShape", "Sampler", "Session", "StaticKVCache", "build_sampler", "checked_seed", "generate",
           "stream"]
