"""Scoring windows in batches: each window's summed negative log-likelihood, and whether greedy
decoding would have produced every token it scores.

Windows of different lengths share a batch by right padding: a causal model's outputs at
a position never depend on later positions, so the padding changes nothing for the real
tokens, and the padded targets are ignored. Windows are taken from the stream a pool at a
time and sorted by length within the pool, so a batch wastes little on padding while
memory stays bounded by the pool, whatever the length of the stream.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import numpy as np
import torch
import torch.nn.functional as F

from specformer_eval.windows import Window

#: Targets that are not scored (history, padding) get this label, which cross_entropy skips.
IGNORE = -100
#: How many batches' worth of windows are pooled and sorted by length before scoring.
POOL_BATCHES = 8


@dataclass(frozen=True)
class Scored:
    """A window's result: the summed negative log-likelihood (nats) of its scored tokens, and
    whether each scored token is the model's most likely one."""

    window: Window
    nll: float
    greedy: bool


def default_batch_size(context: int, *, tokens_per_batch: int = 8192) -> int:
    """Windows per batch: about ``tokens_per_batch`` tokens, at least one window."""
    return max(1, tokens_per_batch // max(1, context))


def score_windows(model: Any, windows: Iterable[Window], *, batch_size: int) -> Iterator[Scored]:
    """Score ``windows`` (any iterable, consumed lazily) with ``model``; results come pool by pool,
    not in input order: use each window's ``tag`` to tell whose it is."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    pool: list[Window] = []
    for window in windows:
        pool.append(window)
        if len(pool) >= batch_size * POOL_BATCHES:
            yield from _score_pool(model, pool, batch_size)
            pool = []
    yield from _score_pool(model, pool, batch_size)


def _score_pool(model: Any, pool: list[Window], batch_size: int) -> Iterator[Scored]:
    pool = sorted(pool, key=lambda w: w.inputs, reverse=True)
    for first in range(0, len(pool), batch_size):
        batch = pool[first : first + batch_size]
        # Entered per batch: the consumer runs between results, outside inference mode.
        with _inference(model):
            nll, greedy = score_batch(model, batch)
        for window, n, g in zip(batch, nll.tolist(), greedy.tolist()):
            yield Scored(window=window, nll=n, greedy=g)


def score_batch(model: Any, batch: list[Window]) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward over right-padded ``batch``: per window, summed NLL ``(B,)`` float64 and all-greedy ``(B,)``."""
    device = next(model.parameters()).device
    width = max(w.inputs for w in batch)
    inputs = np.zeros((len(batch), width), dtype=np.int64)  # padding reads id 0; its outputs are ignored
    targets = np.full((len(batch), width), IGNORE, dtype=np.int64)
    for row, window in enumerate(batch):
        tokens = np.asarray(window.tokens, dtype=np.int64)
        n = window.inputs
        inputs[row, :n] = tokens[:-1]
        targets[row, n - window.scored : n] = tokens[n + 1 - window.scored :]
    inputs_t = torch.from_numpy(inputs).to(device)
    targets_t = torch.from_numpy(targets).to(device)
    logits = model(inputs_t).float()  # (B, T, V); the log-softmax in float32 whatever the model's dtype
    nll = F.cross_entropy(logits.flatten(0, 1), targets_t.flatten(), ignore_index=IGNORE, reduction="none")
    nll = nll.view(len(batch), width).double().sum(dim=1)  # (B,)
    hits = (logits.argmax(dim=-1) == targets_t) | (targets_t == IGNORE)  # (B, T)
    return nll.cpu(), hits.all(dim=1).cpu()


@contextlib.contextmanager
def _inference(model: Any) -> Iterator[None]:
    """Evaluation mode (no dropout) and no autograd while scoring; the model's mode is restored after."""
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        model.train(was_training)
