"""GGUF export: a specformer checkpoint as a file llama.cpp (and the apps built on it) reads.

:func:`to_gguf` writes a model; :func:`llama_layout` says whether a spec maps onto llama.cpp's
``llama`` architecture (and raises :class:`NoGgufMapping` naming the part that does not).
The ``specformer export gguf`` command is :mod:`specformer_gguf.export_command`.
"""

from __future__ import annotations

from specformer_gguf.llama import LlamaLayout, NoGgufMapping, llama_layout
from specformer_gguf.writer import GGUF_TYPES, to_gguf

__all__ = ["GGUF_TYPES", "LlamaLayout", "NoGgufMapping", "llama_layout", "to_gguf"]
