"""Loss, perplexity and bits per byte of a model over a corpus, streamed.

Each document is scored on its own, starting after the end-of-text token (as documents
follow it in training data, and as lm-evaluation-harness's rolling log-likelihood does):
every token of the document is scored once, through the sliding windows of
:mod:`specformer_eval.windows`. With ``L`` the summed negative log-likelihood (nats) over
``N`` scored tokens and ``B`` UTF-8 bytes of text:

* ``loss = L / N`` (nats per token), ``perplexity = exp(loss)``;
* ``bits_per_byte = L / (B ln 2)``, which does not depend on the tokenizer, so models
  with different vocabularies compare.

Documents are read, tokenized, cut and scored a pool of windows at a time, so memory is
bounded by the largest document and the batch, never by the corpus.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

from specformer.errors import UserError
from specformer.tokenizers.tokenizer import Tokenizer

from specformer_eval.scoring import default_batch_size, score_windows
from specformer_eval.windows import Window, check_window_sizes, sliding_windows


@dataclass(frozen=True)
class EvalResult:
    """What :func:`evaluate_documents` measured. ``bytes`` and ``bits_per_byte`` are None for
    already tokenized input (there is no text to count)."""

    loss: float
    perplexity: float
    bits_per_byte: float | None
    tokens: int
    bytes: int | None
    documents: int
    windows: int
    context: int
    stride: int
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / max(self.seconds, 1e-9)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tokens_per_second": self.tokens_per_second}


@dataclass
class _Document:
    """One document's share of the totals, filled in as its windows are scored."""

    nbytes: int
    targets: int


class _Totals:
    def __init__(self, on_progress: Callable[[float], None] | None) -> None:
        self.nll = 0.0
        self.tokens = 0
        self.bytes = 0
        self.documents = 0
        self.windows = 0
        self.on_progress = on_progress

    def add(self, window: Window, nll: float) -> None:
        self.nll += nll
        self.tokens += window.scored
        self.windows += 1
        doc: _Document = window.tag
        if self.on_progress is not None and doc.targets:
            self.on_progress(doc.nbytes * window.scored / doc.targets)  # this window's share of the bytes


def evaluate_documents(
    model: Any,
    tokenizer: Tokenizer,
    documents: Iterable[str],
    *,
    context: int | None = None,
    stride: int | None = None,
    batch_size: int | None = None,
    on_progress: Callable[[float], None] | None = None,
) -> EvalResult:
    """Score every token of ``documents`` (see the module doc).

    ``context`` defaults to the model's context length and ``stride`` to ``context``
    (disjoint windows); ``batch_size`` (windows per forward) to about 8192 tokens.
    ``context`` may pass the model's context length where its positions allow it
    (``Decoder.past_context``: not with learned positions). ``on_progress`` receives
    bytes of text as they are scored.
    """
    context, stride, batch_size = _settings(model, context, stride, batch_size)
    totals = _Totals(on_progress)
    start = time.perf_counter()

    def windows() -> Iterator[Window]:
        for text in documents:
            ids = tokenizer.encode(text)
            check_ids(ids, vocab_size=model.vocab_size, where=f"document {totals.documents + 1}")
            nbytes = len(text.encode("utf-8"))
            totals.bytes += nbytes
            if not ids:
                continue
            totals.documents += 1
            doc = _Document(nbytes=nbytes, targets=len(ids))
            yield from sliding_windows([tokenizer.eot_id, *ids], context=context, stride=stride, tag=doc)

    for result in score_windows(model, windows(), batch_size=batch_size):
        totals.add(result.window, result.nll)
    return _result(totals, context=context, stride=stride, seconds=time.perf_counter() - start, has_bytes=True)


def evaluate_tokens(
    model: Any,
    tokens: Sequence[int],
    *,
    context: int | None = None,
    stride: int | None = None,
    batch_size: int | None = None,
    on_progress: Callable[[float], None] | None = None,
) -> EvalResult:
    """Score ``tokens[1:]`` (one already tokenized stream, e.g. a memory-mapped ``.bin``, its ids
    checked by the caller); ``on_progress`` receives a count of tokens as they are scored."""
    context, stride, batch_size = _settings(model, context, stride, batch_size)
    totals = _Totals(on_progress)
    totals.documents = 1
    doc = _Document(nbytes=max(len(tokens) - 1, 0), targets=max(len(tokens) - 1, 0))
    start = time.perf_counter()
    windows = sliding_windows(tokens, context=context, stride=stride, tag=doc)
    for result in score_windows(model, windows, batch_size=batch_size):
        totals.add(result.window, result.nll)
    return _result(totals, context=context, stride=stride, seconds=time.perf_counter() - start, has_bytes=False)


def _settings(model: Any, context: int | None, stride: int | None, batch_size: int | None) -> tuple[int, int, int]:
    context = model.context_length if context is None else context
    stride = context if stride is None else stride
    check_window_sizes(context=context, stride=stride, limit=context_limit(model))
    return context, stride, default_batch_size(context) if batch_size is None else batch_size


def context_limit(model: Any) -> int | None:
    """The longest window ``model`` can score: its context length, or None (no limit) where every positional
    scheme allows going past it (``Decoder.past_context``: "yes", or "warn" with a warning from the forward)."""
    verdict = model.past_context()[0] if callable(getattr(model, "past_context", None)) else "no"
    return model.context_length if verdict == "no" else None


def _result(totals: _Totals, *, context: int, stride: int, seconds: float, has_bytes: bool) -> EvalResult:
    if totals.tokens == 0:
        raise UserError("there is nothing to score: every document is empty (a document needs at least one token)")
    loss = totals.nll / totals.tokens
    bpb = totals.nll / (totals.bytes * math.log(2)) if has_bytes and totals.bytes else None
    return EvalResult(
        loss=loss,
        perplexity=math.exp(loss) if loss < 700 else math.inf,
        bits_per_byte=bpb,
        tokens=totals.tokens,
        bytes=totals.bytes if has_bytes else None,
        documents=totals.documents,
        windows=totals.windows,
        context=context,
        stride=stride,
        seconds=seconds,
    )


def check_ids(ids: list[int], *, vocab_size: int, where: str) -> None:
    """UserError when the tokenizer produced an id the model has no embedding for."""
    if ids and (max(ids) >= vocab_size or min(ids) < 0):
        bad = next(i for i in ids if not 0 <= i < vocab_size)
        raise UserError(f"{where}: the tokenizer produced id {bad}, outside the model's vocabulary of {vocab_size}; "
                        "the tokenizer does not belong to this model")
