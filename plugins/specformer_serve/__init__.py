"""specformer_serve: ``specformer serve CKPT``, an OpenAI-compatible HTTP server with continuous batching.

The pieces, one file each: :mod:`.paged_cache` (keys and values in fixed-size blocks),
:mod:`.engine` (the scheduler: requests join and leave the running batch at token
boundaries), :mod:`.protocol` (the OpenAI request bodies, checked), :mod:`.app` (the
Starlette routes, server-sent events and errors), :mod:`.events` (engine events to the
event loop), :mod:`.choices` (tokens to text, stop strings), :mod:`.chat_template`
(messages to a prompt), :mod:`.origin` and :mod:`.hosts` (which pages and host names are
served), :mod:`.playground` (the page at ``/``), :mod:`.server` (uvicorn on
a bound socket) and :mod:`.cli` (the command).

Names are imported on first use, so loading the plugin (which every ``specformer`` command
does) imports nothing heavy.
"""

from __future__ import annotations

from specformer.lazy import lazy_exports

_EXPORTS = {
    "Engine": "specformer_serve.engine",
    "SequenceRequest": "specformer_serve.engine",
    "BlockPool": "specformer_serve.paged_cache",
    "PagedKVCache": "specformer_serve.paged_cache",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
