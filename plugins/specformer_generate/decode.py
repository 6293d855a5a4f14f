"""The forward passes of the decode loop, one small function each.

``prefill`` reads the whole prompt into the cache; ``decode_one_token`` reads one new
token per row against the cache (the step ``compile=True`` hands to ``torch.compile``:
its shapes never change, so it compiles once); ``recompute`` is the cache-free
reference that runs the whole sequence again. All return float32 next-token logits
``(B, vocab)``: samplers work in float32 whatever the model's dtype.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch import Tensor

from specformer.model.context import KVCache

StepFn = Callable[[Any, Tensor, Tensor, KVCache], Tensor]

#: When compiling, cache lengths are rounded up to a multiple of this (one graph per bucket).
COMPILE_ROUNDING = 128


def prefill(model: Any, tokens: Tensor, positions: Tensor, cache: KVCache) -> Tensor:
    """Run the prompt ``(B, T)`` through the model, filling ``cache``; logits of the last column."""
    return model(tokens, positions=positions, cache=cache, last_only=True)[:, -1].float()


def decode_one_token(model: Any, token: Tensor, position: Tensor, cache: KVCache) -> Tensor:
    """One new token per row ``(B, 1)`` at ``position`` ``(B, 1)``; logits ``(B, vocab)``."""
    return model(token, positions=position, cache=cache)[:, -1].float()


def recompute(model: Any, tokens: Tensor, positions: Tensor) -> Tensor:
    """No cache: the whole sequence ``(B, T)`` again; logits of the last column."""
    return model(tokens, positions=positions, last_only=True)[:, -1].float()


def cache_capacity(needed: int, *, context_length: int, compile: bool | str = False) -> int:
    """Cache slots for ``needed`` columns: exactly that, or when compiling rounded up to a multiple
    of 128 (within the context) so that calls of similar lengths share one compiled graph."""
    if not compile:
        return needed
    return max(needed, min(-(-needed // COMPILE_ROUNDING) * COMPILE_ROUNDING, context_length))


def step_function(compile: bool | str = False) -> StepFn:
    """``decode_one_token``, compiled when asked (``True`` = inductor, or a backend name)."""
    if not compile:
        return decode_one_token
    return _compiled("inductor" if compile is True else str(compile))


@functools.cache
def _compiled(backend: str) -> StepFn:
    # One wrapper per backend for the whole process, so later generate() calls reuse its graphs.
    return torch.compile(decode_one_token, backend=backend, fullgraph=False, dynamic=False)
