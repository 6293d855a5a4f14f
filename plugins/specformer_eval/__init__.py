"""specformer's eval plugin: perplexity over a corpus, and ``specformer eval``.

::

    from specformer_eval import evaluate_documents
    result = evaluate_documents(model, tokenizer, ["some text", "another document"], context=128, stride=64)
    result.loss, result.perplexity, result.bits_per_byte

Names are imported on first use, so loading the plugin (which every ``specformer``
command does) imports nothing heavy.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "EvalResult": "specformer_eval.perplexity",
    "evaluate_documents": "specformer_eval.perplexity",
    "evaluate_tokens": "specformer_eval.perplexity",
    "Scored": "specformer_eval.scoring",
    "score_windows": "specformer_eval.scoring",
    "Window": "specformer_eval.windows",
    "sliding_windows": "specformer_eval.windows",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'specformer_eval' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
