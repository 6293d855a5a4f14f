"""The recurrent-state contract from a third party's side: a mixer declares the state it keeps per sequence.

A decaying running sum written here as another plugin would write it (registered in a
registry of its own, nothing in the generate plugin edited). The cache, ``summary`` and
the memory estimate are laid out from its declaration, and every consumer of the cache
gives what recompute gives: plain and ragged generation, beam search (states reordered
with the beams) and speculative decoding (states rolled back to the last kept draft, in
the target's cache and in a recurrent draft model's).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import specformer
from specformer.model.state import recurrent_cache
from specformer.model.summary import format_summary, summarize
from specformer_generate import StaticKVCache, generate
from specformer_generate.memory import estimate
from fixtures.caching import cached_logits
from fixtures.recurrent import (VOCAB, WIDTH, DecayingSum, beam_search_by_recompute, registry_with_decaying_sum,
                                spec)


@pytest.fixture(scope="module")
def registry() -> Any:
    return registry_with_decaying_sum()


def build(registry: Any, seed: int, **kw: Any) -> Any:
    return specformer.build(spec(**kw), registry=registry, seed=seed).double().eval()


def test_the_cache_summary_and_estimate_follow_the_declaration(registry: Any) -> None:
    model = specformer.build(spec(), registry=registry, seed=0)
    cache = StaticKVCache.for_model(model, batch_size=2, capacity=9)
    assert cache.slot_counts() == {1: 9}  # only the attention layer keeps something per token
    assert {i: {k: tuple(v.shape) for k, v in s.items()} for i, s in cache._states.items()} == {
        0: {"sum": (2, WIDTH)}, 2: {"sum": (2, WIDTH)}}
    s = summarize(model)
    assert s.state_bytes_per_sequence(torch.float32) == 2 * WIDTH * 4
    assert s.kv_bytes_per_token(torch.float32) == 2 * 4 * 6 * 4  # the attention layer's keys and values only
    text = format_summary(s)
    assert "recurrent state / sequence     96 B fp32, 48 B bf16 (the same at any context)" in text
    assert "mixer kernel                   a loop over tokens  (2 layers)" in text
    kv = 2 * 9 * 2 * 4 * 6 * 4 + 2 * 9 * 8  # keys and values of 9 columns, and their slot positions
    assert estimate(model, rows=2, width=4, new_tokens=5).cache == kv + 2 * 2 * WIDTH * 4


def test_the_model_scheme_is_sized_by_the_layer_that_reads_positions(registry: Any) -> None:
    model = specformer.build(spec(), registry=registry, seed=0)
    assert model.layer_scheme is None  # one rope for the attention layer; the sums never call it
    bad = spec()
    bad["model"]["layers"].append({"select": 0, "positional": {"kind": "alibi"}})
    with pytest.raises(specformer.SpecError, match=r"model\.layers\[1\]\.positional: this layer's mixer \(DecayingSum\) "
                                                   r"reads no positions"):
        specformer.build(bad, registry=registry)


@torch.no_grad()
@pytest.mark.parametrize("attention_layers", [1, None], ids=["hybrid", "recurrent-only"])
def test_generation_with_states_equals_recompute(registry: Any, attention_layers: Any) -> None:
    model = build(registry, 1, attention_layers=attention_layers)
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(0))
    cached = generate(model, prompt, max_new_tokens=10)
    assert torch.equal(cached, generate(model, prompt, max_new_tokens=10, use_cache=False))
    ids = cached.clone()
    torch.testing.assert_close(cached_logits(model, ids, prompt=4)[0], model(ids), rtol=1e-10, atol=1e-10)


@torch.no_grad()
def test_left_padding_never_enters_a_state(registry: Any) -> None:
    model = build(registry, 2)
    prompts = [[3, 1, 4, 1, 5, 9, 2], [6], [5, 3, 5]]
    together = generate(model, prompts, max_new_tokens=6)
    assert together == [generate(model, [p], max_new_tokens=6)[0] for p in prompts]


@torch.no_grad()
def test_packed_documents_run_as_if_alone(registry: Any) -> None:
    model = build(registry, 3)
    a, b = torch.randint(0, VOCAB, (1, 5)), torch.randint(0, VOCAB, (1, 4))
    packed = model(torch.cat((a, b), 1), positions=torch.cat((torch.arange(5), torch.arange(4)))[None],
                   document_ids=torch.tensor([[0] * 5 + [1] * 4]))
    torch.testing.assert_close(packed, torch.cat((model(a), model(b)), 1), rtol=1e-10, atol=1e-10)


@torch.no_grad()
def test_beam_search_reorders_states_with_the_beams(registry: Any) -> None:
    model, prompt = build(registry, 4), torch.randint(0, VOCAB, (1, 4), generator=torch.Generator().manual_seed(1))
    got = generate(model, prompt, max_new_tokens=5, num_beams=3)
    assert got[0].tolist() == beam_search_by_recompute(model, prompt, beams=3, steps=5)


@torch.no_grad()
@pytest.mark.parametrize("draft_tokens", [1, 3])
def test_speculative_decoding_rolls_states_back_to_the_last_kept_draft(registry: Any, draft_tokens: int) -> None:
    """A recurrent target and a recurrent draft that disagree often: both caches roll back, the text is greedy's."""
    target, draft = build(registry, 5), build(registry, 6, n_layers=2, attention_layers=None)
    prompt = torch.randint(0, VOCAB, (2, 4), generator=torch.Generator().manual_seed(2))
    want = generate(target, prompt, max_new_tokens=12, use_cache=False)
    assert torch.equal(generate(target, prompt, max_new_tokens=12, draft=draft, draft_tokens=draft_tokens), want)


def test_a_rollback_past_the_kept_steps_is_refused(registry: Any) -> None:
    model = build(registry, 7, attention_layers=None)
    cache = StaticKVCache.for_model(model, batch_size=1, capacity=10, spare=2)
    ids = torch.randint(0, VOCAB, (1, 6))
    with torch.no_grad():
        model(ids[:, :4], positions=torch.arange(4)[None], cache=cache)
        cache.keep_steps = True
        model(ids[:, 4:], positions=torch.arange(4, 6)[None], cache=cache)
    with pytest.raises(ValueError, match="only the columns of the last 2 spare ones written with keep_steps set"):
        cache.rollback(3)  # inside the prompt, which kept no steps
    cache.rollback(5)
    cache.rollback(4)
    with pytest.raises(ValueError, match="rollback to column 3 of a cache with recurrent states"):
        cache.rollback(3)


def test_a_mixer_that_forgets_its_steps_is_named(registry: Any) -> None:
    cache = StaticKVCache.for_model(build(registry, 8, attention_layers=None), batch_size=1, capacity=4)
    cache.keep_steps = True
    cache.read_state(0, torch.zeros(1, 1, dtype=torch.long))
    with pytest.raises(ValueError, match=r"layer 0 must hand over the state after each token while keep_steps is set"):
        cache.write_state(0, {"sum": torch.zeros(1, WIDTH, dtype=torch.float64)})


def test_a_cache_without_states_is_named_by_the_mixer(registry: Any) -> None:
    class KeysOnly:
        def update(self, *args: Any) -> None: ...

    with pytest.raises(TypeError, match=r"layer 0 \(DecayingSum\) keeps a recurrent state, but the cache KeysOnly has no "
                                        r"read_state/write_state"):
        recurrent_cache(KeysOnly(), DecayingSum(DecayingSum.Params(width=2), d_model=4))


def test_reset_forgets_the_states(registry: Any) -> None:
    model = build(registry, 9, attention_layers=None)
    cache = StaticKVCache.for_model(model, batch_size=1, capacity=4)
    with torch.no_grad():
        model(torch.ones(1, 2, dtype=torch.long), positions=torch.arange(2)[None], cache=cache)
    assert any(bool(s["sum"].abs().sum() > 0) for s in cache._states.values())
    cache.reset()
    assert all(bool(s["sum"].abs().sum() == 0) for s in cache._states.values()) and cache.length == 0
    assert cache.nbytes == 3 * WIDTH * 8  # three layers' states in float64, nothing per token
