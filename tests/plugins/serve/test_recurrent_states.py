"""The serve engine keeps one state slot per running request beside its KV blocks: batched equals alone."""

from __future__ import annotations

import random

import pytest
import specformer

from fixtures.recurrent import VOCAB, registry_with_decaying_sum, spec
from specformer_serve.paged_cache import PagedKVCache

from .test_engine import assert_greedy_batched_equals_alone


@pytest.mark.parametrize("attention_layers", [1, None], ids=["hybrid", "recurrent-only"])
def test_requests_batched_give_what_each_gives_alone(attention_layers) -> None:
    """More requests than the batch holds, so state slots are claimed again after others ended (zeroed)."""
    model = specformer.build(spec(attention_layers=attention_layers), registry=registry_with_decaying_sum(),
                             seed=11).eval()
    rng = random.Random(0)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randrange(1, 12))] for _ in range(7)]
    lengths = [rng.randrange(1, 10) for _ in prompts]
    engine = assert_greedy_batched_equals_alone(model, prompts, lengths, max_batch=3)
    assert sorted(engine.cache._free_states) == [0, 1, 2] and engine.pool.free == engine.pool.num_blocks


def test_a_state_slot_is_claimed_zeroed_and_given_back_once() -> None:
    model = specformer.build(spec(attention_layers=None), registry=registry_with_decaying_sum(), seed=0)
    cache = PagedKVCache.for_model(model, num_blocks=2, block_size=2, state_slots=2)
    first, second = cache.claim_state(), cache.claim_state()
    with pytest.raises(RuntimeError, match="every recurrent state slot is taken"):
        cache.claim_state()
    cache._states[0]["sum"][first] = 5.0
    cache.release_state(first)
    with pytest.raises(ValueError, match=f"state slot {first} is not a taken slot of this cache"):
        cache.release_state(first)
    again = cache.claim_state()
    assert again == first and bool((cache._states[0]["sum"][again] == 0).all())
    with pytest.raises(ValueError, match=r"needs each row's state slot: plan\(\.\.\., state_rows=\[\.\.\.\]\)"):
        cache.plan([[1]], [0], 1)
    assert second != first


def test_a_recurrent_model_needs_state_slots() -> None:
    model = specformer.build(spec(attention_layers=None), registry=registry_with_decaying_sum(), seed=0)
    with pytest.raises(ValueError, match="a model with recurrent layers needs state_slots >= 1"):
        PagedKVCache.for_model(model, num_blocks=2, block_size=2)
