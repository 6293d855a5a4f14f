"""The static / ring-buffer KV cache: generation with it equals generation without it."""

from __future__ import annotations

import pytest
import torch

import specformer
from specformer.errors import SpecError
from specformer.registry.discovery import get_registry
from specformer_generate import StaticKVCache, generate
from specformer_generate.cache import LayerShape

from .specs_for_tests import SPEC_FILES, spec_data, tiny_with

# Left-padded batch: rows of different lengths, one longer than the 8-token windows below.
PROMPTS = [[5, 9, 2, 7, 1, 3, 8, 8, 4, 6, 2, 9], [4, 4, 1], [7]]


def build_double(data: dict, seed: int = 0) -> torch.nn.Module:
    # float64 so that cache and recompute agree on every argmax, not just to rounding.
    return specformer.build(data, seed=seed).double().eval()


def incremental_logits(model, ids: torch.Tensor, chunks: list[int], capacity: int) -> torch.Tensor:
    """Logits of ``ids`` fed through a cache in chunks of the given sizes."""
    cache = StaticKVCache.for_model(model, batch_size=ids.shape[0], capacity=capacity)
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    out, start = [], 0
    for size in chunks:
        out.append(model(ids[:, start : start + size], positions=positions[:, start : start + size], cache=cache))
        start += size
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("path", SPEC_FILES, ids=lambda p: p.name)
def test_cache_gives_the_tokens_of_recompute_for_every_example_spec(path) -> None:
    model = build_double(spec_data(path))
    prompts = [[t % model.vocab_size for t in p] for p in PROMPTS]
    with_cache = generate(model, prompts, max_new_tokens=8)
    without = generate(model, prompts, max_new_tokens=8, use_cache=False)
    assert with_cache == without
    assert [len(r) for r in with_cache] == [len(p) + 8 for p in prompts]


@pytest.mark.parametrize("path", SPEC_FILES, ids=lambda p: p.name)
def test_cached_logits_equal_a_full_forward_for_every_example_spec(path) -> None:
    model = build_double(spec_data(path))
    ids = torch.randint(0, model.vocab_size, (2, 30), generator=torch.Generator().manual_seed(0))
    full = model(ids)
    for chunks in ([30], [17] + [1] * 13, [5, 11, 1, 1, 12]):
        torch.testing.assert_close(incremental_logits(model, ids, chunks, capacity=30), full, rtol=0, atol=1e-10)


def _registered(kind: str) -> list[str]:
    return get_registry().names(kind)


def _build_or_skip(data: dict) -> torch.nn.Module:
    try:
        return build_double(data)
    except SpecError as exc:  # a component whose params have no defaults: a spec file covers it
        pytest.skip(f"needs params beyond the defaults: {exc}")


@pytest.mark.parametrize("name", _registered("positional"))
def test_every_positional_scheme_works_with_the_cache(name: str) -> None:
    for window in (None, 8):
        data = tiny_with(positional={"kind": name})
        if window:
            data["model"]["layers"] = [{"select": 0, "attention": {"window": window}}]
        model = _build_or_skip(data)
        assert generate(model, PROMPTS, max_new_tokens=10) == generate(model, PROMPTS, max_new_tokens=10, use_cache=False)
        ids = torch.randint(0, model.vocab_size, (2, 25), generator=torch.Generator().manual_seed(1))
        torch.testing.assert_close(incremental_logits(model, ids, [13] + [1] * 12, 25), model(ids), rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", _registered("layout"))
def test_every_layout_works_with_the_cache(name: str) -> None:
    model = _build_or_skip(tiny_with(layout={"kind": name}))
    assert generate(model, PROMPTS, max_new_tokens=10) == generate(model, PROMPTS, max_new_tokens=10, use_cache=False)


def test_ring_buffer_memory_is_bounded_by_the_window() -> None:
    data = tiny_with()
    data["model"]["layers"] = [{"select": 0, "attention": {"window": 8}}]
    model = build_double(data)
    cache = StaticKVCache.for_model(model, batch_size=3, capacity=60)
    assert cache.slot_counts() == {0: 8, 1: 60}
    attention = model.blocks[0].attention
    per_slot = 2 * 3 * attention.n_kv_heads * attention.head_dim * 8  # keys + values, float64
    positions_bytes = 3 * (8 + 60) * 8
    assert cache.nbytes == per_slot * (8 + 60) + positions_bytes
    # A window at least as long as the generation is just a static buffer.
    assert StaticKVCache.for_model(model, batch_size=1, capacity=6).slot_counts() == {0: 6, 1: 6}


def test_prefill_longer_than_the_window_and_decoding_past_it() -> None:
    data = tiny_with(positional={"kind": "rope"})
    data["model"]["layers"] = [{"select": "all", "attention": {"window": 4}}]
    model = build_double(data)
    ids = torch.randint(0, model.vocab_size, (2, 40), generator=torch.Generator().manual_seed(2))
    full = model(ids)
    for chunks in ([40], [11] + [1] * 29, [3, 9, 1, 6, 1, 20]):
        torch.testing.assert_close(incremental_logits(model, ids, chunks, capacity=40), full, rtol=0, atol=1e-10)


def test_the_window_is_respected_not_just_the_buffer() -> None:
    """With a window, tokens further back than the window must not change the next logits."""
    data = tiny_with(n_layers=1)
    data["model"]["layers"] = [{"select": 0, "attention": {"window": 3}}]
    model = build_double(data)
    a = torch.tensor([[1, 2, 3, 4, 5, 6]])
    b = torch.tensor([[9, 9, 9, 4, 5, 6]])
    la = incremental_logits(model, a, [2, 1, 1, 1, 1], capacity=6)[:, -1]
    lb = incremental_logits(model, b, [2, 1, 1, 1, 1], capacity=6)[:, -1]
    torch.testing.assert_close(la, lb, rtol=0, atol=1e-12)  # one layer: only the last 3 tokens matter


def test_writing_past_the_capacity_is_an_error() -> None:
    model = build_double(tiny_with())
    cache = StaticKVCache.for_model(model, batch_size=1, capacity=4)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with pytest.raises((IndexError, RuntimeError)):
        model(ids, positions=torch.arange(5)[None], cache=cache)


def test_reorder_copies_rows() -> None:
    model = build_double(tiny_with())
    ids = torch.randint(0, model.vocab_size, (3, 7), generator=torch.Generator().manual_seed(3))
    pos = torch.arange(7).expand(3, 7)
    cache = StaticKVCache.for_model(model, batch_size=3, capacity=8)
    model(ids[:, :6], positions=pos[:, :6], cache=cache)
    order = torch.tensor([2, 2, 0])
    cache.reorder(order)
    next_logits = model(ids[order, 6:], positions=pos[:, 6:], cache=cache)[:, -1]
    torch.testing.assert_close(next_logits, model(ids[order])[:, -1], rtol=0, atol=1e-10)


def test_reset_forgets_the_contents() -> None:
    model = build_double(tiny_with())
    ids = torch.randint(0, model.vocab_size, (1, 5), generator=torch.Generator().manual_seed(4))
    cache = StaticKVCache.for_model(model, batch_size=1, capacity=5)
    model(ids, positions=torch.arange(5)[None], cache=cache)
    assert cache.length == 5
    cache.reset()
    assert cache.length == 0
    torch.testing.assert_close(model(ids, positions=torch.arange(5)[None], cache=cache), model(ids), rtol=0, atol=1e-10)


def test_buffers_follow_the_model_dtype_and_the_given_shapes() -> None:
    model = specformer.build(tiny_with(), seed=0).to(torch.bfloat16)
    cache = StaticKVCache.for_model(model, batch_size=2, capacity=9)
    layer = cache._layers[0]
    assert layer.keys.dtype == torch.bfloat16
    assert layer.keys.shape == (2, 2, 9, 8)  # (B, n_kv_heads, S, head_dim)
    with pytest.raises(ValueError, match="batch_size >= 1"):
        StaticKVCache(layers=[LayerShape(layer_index=0, n_kv_heads=1, head_dim=4)], batch_size=0, capacity=4)
