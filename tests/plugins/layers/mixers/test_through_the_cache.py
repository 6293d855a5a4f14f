"""Every recurrent mixer inside a model, through the caches: the checks of ``through_the_cache`` on each.

Each mixer's own test file says how a tiny model of it is built (``tiny_model``): alone, and with
the middle layer attention (``mixed``). Here both are decoded token by token and by chunks, as a
left-padded ragged batch, as packed documents, through beam reordering and speculative rollback,
and by the serve engine with more requests than its batch holds.
"""

from __future__ import annotations

import pytest

from . import test_lightning, test_mamba, test_mamba2, test_rglru, test_rwkv4
from .through_the_cache import (
    assert_a_left_padded_ragged_batch_equals_each_row_alone,
    assert_cached_decode_equals_the_uncached_forward,
    assert_packed_documents_equal_each_document_alone,
    assert_reorder_and_rollback_restore_the_states_exactly,
    assert_served_requests_batched_give_what_each_gives_alone,
)

pytestmark = pytest.mark.usefixtures("one_thread")

#: The mixer kind -> its test file's tiny model (test_mamba decodes its B/C/dt norm options itself).
TINY_MODELS = {module.MIXER["kind"]: module.tiny_model
               for module in (test_lightning, test_mamba, test_mamba2, test_rglru, test_rwkv4)}
ALONE_AND_MIXED = [pytest.param(kind, mixed, id=f"{kind}-{'mixed' if mixed else 'alone'}")
                   for kind in TINY_MODELS for mixed in (False, True)]


@pytest.mark.parametrize(("kind", "mixed"), ALONE_AND_MIXED)
def test_cached_decode_equals_the_uncached_forward(kind: str, mixed: bool) -> None:
    assert_cached_decode_equals_the_uncached_forward(TINY_MODELS[kind](mixed))


@pytest.mark.parametrize(("kind", "mixed"), ALONE_AND_MIXED)
def test_a_left_padded_ragged_batch_equals_each_row_alone(kind: str, mixed: bool) -> None:
    """Through the cache and recomputed without one: padding never enters a state."""
    assert_a_left_padded_ragged_batch_equals_each_row_alone(TINY_MODELS[kind](mixed))


@pytest.mark.parametrize("kind", TINY_MODELS)
def test_packed_documents_equal_each_document_alone(kind: str) -> None:
    """Each document's first token resets the recurrence."""
    assert_packed_documents_equal_each_document_alone(TINY_MODELS[kind]())


@pytest.mark.parametrize("kind", TINY_MODELS)
def test_reorder_and_rollback_restore_the_states_exactly(kind: str) -> None:
    assert_reorder_and_rollback_restore_the_states_exactly(TINY_MODELS[kind](mixed=True))


@pytest.mark.parametrize("kind", TINY_MODELS)
def test_served_requests_batched_give_what_each_gives_alone(kind: str) -> None:
    assert_served_requests_batched_give_what_each_gives_alone(TINY_MODELS[kind](mixed=True))
