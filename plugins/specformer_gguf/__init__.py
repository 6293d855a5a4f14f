"""GGUF export: a specformer checkpoint as a file llama.cpp (and the apps built on it) reads.

:func:`to_gguf` writes a model; :func:`llama_layout` says whether a spec maps onto llama.cpp's
``llama`` architecture (and raises :class:`NoGgufMapping` naming the part that does not).
The ``specformer export gguf`` command is :mod:`specformer_gguf.export_command`.
"""

from __future__ import annotations

from specformer.lazy import lazy_exports

# Names are imported on first use: loading the plugin (which every ``specformer`` command does, --help
# included) must import neither torch nor gguf.
_EXPORTS = {
    "GGUF_TYPES": "specformer_gguf.writer",
    "to_gguf": "specformer_gguf.writer",
    "LlamaLayout": "specformer_gguf.llama",
    "NoGgufMapping": "specformer_gguf.llama",
    "llama_layout": "specformer_gguf.llama",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
