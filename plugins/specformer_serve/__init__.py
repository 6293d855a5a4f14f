"""specformer_serve: ``specformer serve CKPT``, an OpenAI-compatible HTTP server with continuous batching.

The pieces, one file each: :mod:`.paged_cache` (keys and values in fixed-size blocks),
:mod:`.engine` (the scheduler: requests join and leave the running batch at token
boundaries), :mod:`.protocol` (the OpenAI request bodies, checked), :mod:`.app` (the
Starlette routes, server-sent events and errors), :mod:`.events` (engine events to the
event loop), :mod:`.choices` (tokens to text, stop strings), :mod:`.chat_template`
(messages to a prompt), :mod:`.playground` (the page at ``/``), :mod:`.server` (uvicorn on
a bound socket) and :mod:`.cli` (the command).
"""

from specformer_serve.engine import Engine, SequenceRequest
from specformer_serve.paged_cache import BlockPool, PagedKVCache

__all__ = ["BlockPool", "Engine", "PagedKVCache", "SequenceRequest"]
