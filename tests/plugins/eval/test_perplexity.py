"""Perplexity over documents: the totals against a reference written out in the test, windows, streaming."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from specformer_eval import evaluate_documents, evaluate_tokens, score_windows, sliding_windows
from specformer_eval.windows import Window

from .support import BYTES, DOCUMENTS, byte_model, reference_nll


@pytest.fixture(scope="module")
def model():
    return byte_model()


def test_perplexity_is_exp_of_the_mean_token_loss(model):
    docs = ["hello world", "a short one", "x = 1\n"]  # each fits in one window
    losses = []
    with torch.no_grad():
        for text in docs:
            ids = torch.tensor([[BYTES.eot_id, *BYTES.encode(text)]])
            logits = model(ids[:, :-1])
            losses.append(F.cross_entropy(logits[0], ids[0, 1:], reduction="none"))
    mean = torch.cat(losses).mean().item()
    result = evaluate_documents(model, BYTES, docs)
    assert result.tokens == sum(len(t.encode()) for t in docs)
    assert result.loss == pytest.approx(mean, rel=1e-6)
    assert result.perplexity == pytest.approx(math.exp(mean), rel=1e-6)


@pytest.mark.parametrize("context,stride", [(32, 32), (32, 8), (16, 5), (7, 1)])
def test_strided_evaluation_equals_a_hand_written_loop(model, context, stride):
    total, count = 0.0, 0
    for text in DOCUMENTS:
        nll, n = reference_nll(model, [BYTES.eot_id, *BYTES.encode(text)], context=context, stride=stride)
        total, count = total + nll, count + n
    result = evaluate_documents(model, BYTES, DOCUMENTS, context=context, stride=stride, batch_size=3)
    assert result.tokens == count == sum(len(t.encode()) for t in DOCUMENTS)
    assert result.loss == pytest.approx(total / count, rel=1e-5)
    assert result.documents == 3  # the empty one has nothing to score


@pytest.mark.filterwarnings("ignore:a sequence of 48 tokens, past")  # the forward's warning; tested in core
def test_windows_past_the_context_where_the_positions_allow_it(model):
    """RoPE goes past its context of 32 (with the forward's warning); the windows are scored as a hand-written loop does."""
    text = DOCUMENTS[0]  # 105 bytes: windows of 48 pass the context
    nll, count = reference_nll(model, [BYTES.eot_id, *BYTES.encode(text)], context=48, stride=48)
    result = evaluate_documents(model, BYTES, [text], context=48)
    assert result.context == 48 and result.tokens == count
    assert result.loss == pytest.approx(nll / count, rel=1e-5)


def test_bits_per_byte_by_formula(model):
    total, _ = map(sum, zip(*(reference_nll(model, [BYTES.eot_id, *BYTES.encode(t)], context=32, stride=16)
                              for t in DOCUMENTS)))
    n_bytes = sum(len(t.encode("utf-8")) for t in DOCUMENTS)
    assert n_bytes > sum(len(t) for t in DOCUMENTS)  # the multi-byte characters count as bytes
    result = evaluate_documents(model, BYTES, DOCUMENTS, context=32, stride=16)
    assert result.bytes == n_bytes
    assert result.bits_per_byte == pytest.approx(total / (n_bytes * math.log(2)), rel=1e-5)


def test_batching_does_not_change_the_result(model):
    one = evaluate_documents(model, BYTES, DOCUMENTS, context=16, stride=8, batch_size=1)
    many = evaluate_documents(model, BYTES, DOCUMENTS, context=16, stride=8, batch_size=64)
    assert many.loss == pytest.approx(one.loss, rel=1e-6)
    assert (many.tokens, many.windows) == (one.tokens, one.windows)


def test_a_token_stream_scores_every_token_after_the_first(model):
    tokens = np.array(BYTES.encode(DOCUMENTS[0] + DOCUMENTS[3]), dtype=np.uint16)
    nll, count = reference_nll(model, tokens.tolist(), context=32, stride=12)
    result = evaluate_tokens(model, tokens, context=32, stride=12)
    assert result.tokens == count == len(tokens) - 1
    assert result.loss == pytest.approx(nll / count, rel=1e-5)
    assert result.bits_per_byte is None and result.bytes is None


@pytest.mark.parametrize("length,context,stride", [(1, 4, 4), (2, 4, 4), (5, 4, 4), (10, 4, 2), (10, 4, 1), (37, 8, 3)])
def test_windows_score_each_token_once_with_enough_history(length, context, stride):
    tokens = list(range(100, 100 + length))
    seen = []
    for window in sliding_windows(tokens, context=context, stride=stride):
        assert 1 <= window.inputs <= context and 1 <= window.scored <= window.inputs
        first = tokens.index(window.tokens[0])
        for target in range(first + window.inputs + 1 - window.scored, first + window.inputs + 1):
            seen.append(target)
            history = target - first
            assert history >= min(context - stride + 1, target), (target, window)
    assert seen == list(range(1, length))


def test_scoring_streams(model):
    """Results come while the windows are still being produced: nothing waits for the end of the stream."""
    produced = 0

    def endless():
        nonlocal produced
        for i in itertools.count():
            produced += 1
            yield Window(tokens=[i % 200, (i + 1) % 200, (i + 2) % 200], scored=2)

    first = list(itertools.islice(score_windows(model, endless(), batch_size=4), 10))
    assert len(first) == 10 and produced <= 4 * 8 + 1  # one pool of eight batches, then results


def test_window_sizes_are_checked(model):
    learned = byte_model(positional={"kind": "learned"})  # no position past 32
    with pytest.raises(ValueError, match="context must be between 1 and the model's context length 32"):
        evaluate_documents(learned, BYTES, ["abc"], context=33)
    with pytest.raises(ValueError, match="stride must be between 1 and the context"):
        evaluate_documents(model, BYTES, ["abc"], context=8, stride=9)


def test_nothing_to_score_is_an_error(model):
    from specformer.errors import UserError

    with pytest.raises(UserError, match="nothing to score"):
        evaluate_documents(model, BYTES, ["", ""])
