"""The static / ring-buffer KV cache: generation with it equals generation without it, and the cache itself
against a cache written out slot by slot.

Through a model most cache bugs are shared by the cached and the recomputed path or hidden by the
attention mask, so the second half drives the cache directly with hand-made keys and a reference
that keeps every layer's slots in Python loops: where each column lands (a ring wraps at
``window + spare``), what ``update`` returns (a ring given several tokens returns the ring as it was
plus all new tokens), the slot positions (``-1`` for empty), rollback, reorder, reset, the checks on
bad arguments, and the buffers' shapes, dtype and device.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

import specformer
from specformer.model.attention import CacheSlots
from specformer.errors import SpecError
from specformer.registry.discovery import get_registry
from specformer_generate import StaticKVCache, generate
from specformer_generate.cache import LayerShape

from .specs_for_tests import example_specs, spec_data, tiny_with

# Left-padded batch: rows of different lengths, one longer than the 8-token windows below.
PROMPTS = [[5, 9, 2, 7, 1, 3, 8, 8, 4, 6, 2, 9], [4, 4, 1], [7]]

# Left out of mutation runs: these run whole models, over a minute per mutant in all; the tests of
# StaticKVCache itself, below, drive the cache directly.
THROUGH_A_MODEL = pytest.mark.mutation_exempt("runs whole models; the StaticKVCache tests below drive the cache directly")


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


def ties_to_the_earliest(data: Any) -> Any:
    """``data`` with every indexer breaking exact score ties at the cut to the earliest key.

    ``ties: topk`` (what the DeepSeek-V3.2/V4 specs set, as transformers) takes what
    ``torch.topk`` returns over the row, which depends on the row's length: a cached step,
    whose row holds fewer keys, may then choose otherwise than recomputing, as in
    transformers (docs/components-guide.md). Cache equals recompute is the claim of ``first``.
    """
    if isinstance(data, dict):
        return {k: ("first" if k in ("ties", "index_ties") and v == "topk" else ties_to_the_earliest(v))
                for k, v in data.items()}
    if isinstance(data, list):
        return [ties_to_the_earliest(v) for v in data]
    return data


@THROUGH_A_MODEL
@pytest.mark.parametrize("path", example_specs())
def test_cache_gives_the_tokens_of_recompute_for_every_example_spec(path) -> None:
    model = build_double(ties_to_the_earliest(spec_data(path)))
    prompts = [[t % model.vocab_size for t in p] for p in PROMPTS]
    with_cache = generate(model, prompts, max_new_tokens=8)
    without = generate(model, prompts, max_new_tokens=8, use_cache=False)
    assert with_cache == without
    assert [len(r) for r in with_cache] == [len(p) + 8 for p in prompts]


@THROUGH_A_MODEL
@pytest.mark.parametrize("path", example_specs())
def test_cached_logits_equal_a_full_forward_for_every_example_spec(path) -> None:
    model = build_double(ties_to_the_earliest(spec_data(path)))
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


@THROUGH_A_MODEL
@pytest.mark.parametrize("name", _registered("positional"))
def test_every_positional_scheme_works_with_the_cache(name: str) -> None:
    for window in (None, 8):
        data = tiny_with(positional={"kind": name})
        if window:
            data["model"]["layers"] = [{"select": 0, "mixer": {"window": window}}]
        model = _build_or_skip(data)
        assert generate(model, PROMPTS, max_new_tokens=10) == generate(model, PROMPTS, max_new_tokens=10, use_cache=False)
        ids = torch.randint(0, model.vocab_size, (2, 25), generator=torch.Generator().manual_seed(1))
        torch.testing.assert_close(incremental_logits(model, ids, [13] + [1] * 12, 25), model(ids), rtol=0, atol=1e-10)


@THROUGH_A_MODEL
@pytest.mark.parametrize("name", _registered("layout"))
def test_every_layout_works_with_the_cache(name: str) -> None:
    model = _build_or_skip(tiny_with(layout={"kind": name}))
    assert generate(model, PROMPTS, max_new_tokens=10) == generate(model, PROMPTS, max_new_tokens=10, use_cache=False)


@THROUGH_A_MODEL
def test_ring_buffer_memory_is_bounded_by_the_window() -> None:
    data = tiny_with()
    data["model"]["layers"] = [{"select": 0, "mixer": {"window": 8}}]
    model = build_double(data)
    cache = StaticKVCache.for_model(model, batch_size=3, capacity=60)
    assert cache.slot_counts() == {0: 8, 1: 60}
    attention = model.blocks[0].mixer
    per_slot = 2 * 3 * attention.n_kv_heads * attention.head_dim * 8  # keys + values, float64
    positions_bytes = 3 * (8 + 60) * 8
    assert cache.nbytes == per_slot * (8 + 60) + positions_bytes
    # A window at least as long as the generation is just a static buffer.
    assert StaticKVCache.for_model(model, batch_size=1, capacity=6).slot_counts() == {0: 6, 1: 6}


@THROUGH_A_MODEL
def test_prefill_longer_than_the_window_and_decoding_past_it() -> None:
    data = tiny_with(positional={"kind": "rope"})
    data["model"]["layers"] = [{"select": "all", "mixer": {"window": 4}}]
    model = build_double(data)
    ids = torch.randint(0, model.vocab_size, (2, 40), generator=torch.Generator().manual_seed(2))
    full = model(ids)
    for chunks in ([40], [11] + [1] * 29, [3, 9, 1, 6, 1, 20]):
        torch.testing.assert_close(incremental_logits(model, ids, chunks, capacity=40), full, rtol=0, atol=1e-10)


@THROUGH_A_MODEL
def test_the_window_is_respected_not_just_the_buffer() -> None:
    """With a window, tokens further back than the window must not change the next logits."""
    data = tiny_with(n_layers=1)
    data["model"]["layers"] = [{"select": 0, "mixer": {"window": 3}}]
    model = build_double(data)
    a = torch.tensor([[1, 2, 3, 4, 5, 6]])
    b = torch.tensor([[9, 9, 9, 4, 5, 6]])
    la = incremental_logits(model, a, [2, 1, 1, 1, 1], capacity=6)[:, -1]
    lb = incremental_logits(model, b, [2, 1, 1, 1, 1], capacity=6)[:, -1]
    torch.testing.assert_close(la, lb, rtol=0, atol=1e-12)  # one layer: only the last 3 tokens matter


@THROUGH_A_MODEL
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


@THROUGH_A_MODEL
def test_reset_forgets_the_contents() -> None:
    model = build_double(tiny_with())
    ids = torch.randint(0, model.vocab_size, (1, 5), generator=torch.Generator().manual_seed(4))
    cache = StaticKVCache.for_model(model, batch_size=1, capacity=5)
    model(ids, positions=torch.arange(5)[None], cache=cache)
    assert cache.length == 5
    cache.reset()
    assert cache.length == 0
    torch.testing.assert_close(model(ids, positions=torch.arange(5)[None], cache=cache), model(ids), rtol=0, atol=1e-10)


@THROUGH_A_MODEL
def test_buffers_follow_the_model_dtype_and_the_given_shapes() -> None:
    model = specformer.build(tiny_with(), seed=0).to(torch.bfloat16)
    cache = StaticKVCache.for_model(model, batch_size=2, capacity=9)
    layer = cache._layers[0]
    assert layer.keys.dtype == torch.bfloat16
    assert layer.keys.shape == (2, 2, 9, 8)  # (B, n_kv_heads, S, head_dim)
    with pytest.raises(ValueError, match="batch_size >= 1"):
        StaticKVCache(layers=[LayerShape(layer_index=0, n_kv_heads=1, head_dim=4)], batch_size=0, capacity=4)


# -- StaticKVCache itself, against a cache written out slot by slot ---------------------------

B = 3
CAPACITY = 10


class Slots:
    """One layer's slots, written one token at a time: the reference for what the cache holds."""

    def __init__(self, *, size: int, ring: bool, key_shape: tuple[int, int], value_shape: tuple[int, int]) -> None:
        self.size, self.ring = size, ring
        self.keys = torch.zeros(B, key_shape[0], size, key_shape[1], dtype=torch.float64)
        self.values = torch.zeros(B, value_shape[0], size, value_shape[1], dtype=torch.float64)
        self.positions = torch.full((B, size), -1, dtype=torch.long)

    def slot(self, column: int) -> int:
        return column % self.size if self.ring else column

    def update(self, first_column: int, key, value, positions):
        """Write tokens in order (a later one overwrites an earlier one in the same ring slot)."""
        length = key.shape[2]
        if self.ring and length > 1:  # what attention must see: the ring before this forward plus every new token
            seen = (torch.cat((self.keys, key), 2), torch.cat((self.values, value), 2),
                    torch.cat((self.positions, positions), 1))
        for t in range(length):
            s = self.slot(first_column + t)
            self.keys[:, :, s] = key[:, :, t]
            self.values[:, :, s] = value[:, :, t]
            self.positions[:, s] = positions[:, t]
        if self.ring and length > 1:
            return seen
        return self.keys.clone(), self.values.clone(), self.positions.clone()

    def drop(self, column: int) -> None:
        self.positions[:, self.slot(column)] = -1


# Three layers given out of order: 4 (no window, capacity slots), 1 and 2 (window 3, one spare
# slot: a ring of 4), 1 with values wider than its keys. Layer 1 is the first to see a forward.
SHAPES = [
    LayerShape(layer_index=4, n_kv_heads=2, head_dim=3),
    LayerShape(layer_index=1, n_kv_heads=1, head_dim=2, window=3, value_heads=3, value_dim=5),
    LayerShape(layer_index=2, n_kv_heads=2, head_dim=3, window=3),
]
SPARE = 1
RING = 3 + SPARE


def reference_layers() -> dict[int, Slots]:
    return {
        4: Slots(size=CAPACITY, ring=False, key_shape=(2, 3), value_shape=(2, 3)),
        1: Slots(size=RING, ring=True, key_shape=(1, 2), value_shape=(3, 5)),
        2: Slots(size=RING, ring=True, key_shape=(2, 3), value_shape=(2, 3)),
    }


def new_cache(**changes) -> StaticKVCache:
    settings = dict(layers=SHAPES, batch_size=B, capacity=CAPACITY, dtype=torch.float64, spare=SPARE)
    return StaticKVCache(**{**settings, **changes})


def forward(cache: StaticKVCache, reference: dict[int, Slots], column: int, positions: torch.Tensor,
            generator: torch.Generator) -> None:
    """One forward of ``positions.shape[1]`` tokens through every layer, checked against the reference."""
    for index in sorted(reference):
        slots = reference[index]
        key = torch.randn(B, slots.keys.shape[1], positions.shape[1], slots.keys.shape[3], generator=generator,
                          dtype=torch.float64)
        value = torch.randn(B, slots.values.shape[1], positions.shape[1], slots.values.shape[3],
                            generator=generator, dtype=torch.float64)
        got = cache.update(index, key, value, positions)
        want = slots.update(column, key, value, positions)
        for name, g, w in zip(("keys", "values", "positions"), got, want):
            assert g.shape == w.shape, f"layer {index} {name}: shape {tuple(g.shape)}, expected {tuple(w.shape)}"
            assert torch.equal(g, w), f"layer {index} {name} after writing column {column}:\n{g}\nexpected\n{w}"


def positions_for(start: int, length: int, padded_row_until: int | None = None) -> torch.Tensor:
    """``(B, length)`` absolute positions from ``start``; row 1 is left padding (``-1``) before ``padded_row_until``."""
    pos = torch.arange(start, start + length).repeat(B, 1)
    if padded_row_until is not None:
        pos[1, : padded_row_until - start] = -1
    return pos


def test_writes_and_reads_follow_the_written_out_slots_through_a_wraparound() -> None:
    cache, reference, gen = new_cache(), reference_layers(), torch.Generator().manual_seed(0)
    # A padded prompt of 5 (longer than the ring of 4: its first tokens are overwritten within
    # the forward), single-token steps that wrap the ring, then a chunk of 2 (speculation's shape).
    column = 0
    for length in (5, 1, 1, 2, 1):  # 10 columns: the capacity
        forward(cache, reference, column, positions_for(column, length, padded_row_until=2 if column == 0 else None), gen)
        column += length
        assert cache.length == column
        assert int(cache.cursor) == column


def test_a_chunk_shorter_than_the_ring_keeps_every_token_and_returns_the_old_ring_beside_it() -> None:
    cache, reference, gen = new_cache(), reference_layers(), torch.Generator().manual_seed(1)
    forward(cache, reference, 0, positions_for(0, 2), gen)  # 2 of 4 ring slots: the rest still read -1
    forward(cache, reference, 2, positions_for(2, 3), gen)  # wraps: slot 0 overwritten, slots 2, 3 filled
    forward(cache, reference, 5, positions_for(5, 1), gen)


def test_rollback_marks_the_dropped_slots_empty_and_the_next_forward_writes_there() -> None:
    cache, reference, gen = new_cache(), reference_layers(), torch.Generator().manual_seed(2)
    forward(cache, reference, 0, positions_for(0, 5), gen)
    forward(cache, reference, 5, positions_for(5, 1), gen)  # column 5: ring slot 1
    cache.rollback(5)  # one column back: as much as the one spare slot keeps
    for slots in reference.values():
        slots.drop(5)
    assert cache.length == 5
    forward(cache, reference, 5, positions_for(5, 1), gen)  # rewritten at column 5, position 5
    cache.rollback(6)  # nothing to drop
    assert cache.length == 6
    forward(cache, reference, 6, positions_for(6, 2), gen)


def test_rollback_of_several_columns_without_ring_layers() -> None:
    shapes = [LayerShape(layer_index=0, n_kv_heads=1, head_dim=2), LayerShape(layer_index=1, n_kv_heads=1, head_dim=2,
                                                                               window=12)]  # window >= capacity: no ring
    cache = StaticKVCache(layers=shapes, batch_size=B, capacity=CAPACITY, dtype=torch.float64)
    reference = {i: Slots(size=CAPACITY, ring=False, key_shape=(1, 2), value_shape=(1, 2)) for i in (0, 1)}
    gen = torch.Generator().manual_seed(3)
    forward(cache, reference, 0, positions_for(0, 7), gen)
    cache.rollback(3)  # four columns back: no ring, so spare=0 does not limit it
    for slots in reference.values():
        for column in range(3, 7):
            slots.drop(column)
    forward(cache, reference, 3, positions_for(3, 1), gen)
    cache.rollback(0)
    for slots in reference.values():
        for column in range(0, 4):
            slots.drop(column)
    forward(cache, reference, 0, positions_for(0, 1), gen)


def test_rollback_refuses_what_it_cannot_give_back() -> None:
    cache, reference, gen = new_cache(), reference_layers(), torch.Generator().manual_seed(4)
    forward(cache, reference, 0, positions_for(0, 4), gen)
    with pytest.raises(ValueError, match=r"^rollback to column -1: only 4 columns are written$"):
        cache.rollback(-1)
    with pytest.raises(ValueError, match=r"^rollback to column 5: only 4 columns are written$"):
        cache.rollback(5)
    # Two columns back is more than the ring's one spare slot kept (the layer without a ring could).
    with pytest.raises(ValueError, match=r"^rollback by 2 columns, but this cache's ring layers keep only 1 spare "
                                         r"slots; build it with spare=2 or more$"):
        cache.rollback(2)
    assert cache.length == 4  # refused: nothing changed
    forward(cache, reference, 4, positions_for(4, 1), gen)


def test_rollback_to_column_zero_is_allowed() -> None:
    shapes = [LayerShape(layer_index=0, n_kv_heads=1, head_dim=2, window=2)]  # a ring of 2 + 2 spare = 4
    cache = StaticKVCache(layers=shapes, batch_size=B, capacity=CAPACITY, dtype=torch.float64, spare=2)
    reference = {0: Slots(size=4, ring=True, key_shape=(1, 2), value_shape=(1, 2))}
    gen = torch.Generator().manual_seed(5)
    forward(cache, reference, 0, positions_for(0, 2), gen)
    cache.rollback(0)
    reference[0].drop(0)
    reference[0].drop(1)
    assert cache.length == 0
    forward(cache, reference, 0, positions_for(0, 1), gen)


def test_reorder_copies_keys_values_and_positions_of_every_layer() -> None:
    cache, reference, gen = new_cache(), reference_layers(), torch.Generator().manual_seed(6)
    forward(cache, reference, 0, positions_for(0, 3, padded_row_until=1), gen)
    rows = torch.tensor([1, 1, 0])
    cache.reorder(rows)
    for slots in reference.values():
        slots.keys, slots.values, slots.positions = slots.keys[rows], slots.values[rows], slots.positions[rows]
    forward(cache, reference, 3, positions_for(3, 1), gen)


def test_reset_forgets_positions_and_the_cursor() -> None:
    cache, reference, gen = new_cache(), reference_layers(), torch.Generator().manual_seed(7)
    forward(cache, reference, 0, positions_for(0, 5), gen)
    cache.reset()
    assert cache.length == 0
    for slots in reference.values():
        slots.positions.fill_(-1)  # the buffers keep their numbers; only the positions say what is there
    forward(cache, reference, 0, positions_for(0, 1), gen)


def test_writing_past_the_capacity_is_an_index_error() -> None:
    shapes = [LayerShape(layer_index=0, n_kv_heads=1, head_dim=2)]
    cache = StaticKVCache(layers=shapes, batch_size=1, capacity=3)
    key = torch.zeros(1, 1, 2, 2)
    cache.update(0, key, key, torch.tensor([[0, 1]]))
    with pytest.raises(IndexError):
        cache.update(0, key, key, torch.tensor([[2, 3]]))


def test_slot_counts_sizes_and_memory() -> None:
    cache = new_cache()
    assert cache.slot_counts() == {1: RING, 2: RING, 4: CAPACITY}
    assert list(cache.slot_counts()) == [1, 2, 4]
    assert (cache.batch_size, cache.capacity, cache.spare) == (B, CAPACITY, SPARE)
    # float64 keys and values plus one int64 positions table per buffer length (layers 1 and 2 share one).
    floats = B * (2 * CAPACITY * 3 * 2) + B * (1 * RING * 2 + 3 * RING * 5) + B * (2 * RING * 3 * 2)
    assert cache.nbytes == 8 * floats + 8 * B * (CAPACITY + RING)
    # A window exactly as long as the capacity needs no ring; one shorter does.
    assert new_cache(capacity=4).slot_counts() == {1: 4, 2: 4, 4: 4}
    assert new_cache(capacity=5).slot_counts() == {1: 4, 2: 4, 4: 5}
    assert new_cache(spare=0).slot_counts() == {1: 3, 2: 3, 4: CAPACITY}


def test_a_window_as_long_as_the_capacity_is_a_plain_buffer() -> None:
    # window + spare == capacity: no ring, so a chunk returns the buffer, not the buffer plus the chunk.
    shapes = [LayerShape(layer_index=0, n_kv_heads=1, head_dim=2, window=3)]
    cache = StaticKVCache(layers=shapes, batch_size=B, capacity=4, dtype=torch.float64, spare=1)
    reference = {0: Slots(size=4, ring=False, key_shape=(1, 2), value_shape=(1, 2))}
    gen = torch.Generator().manual_seed(8)
    forward(cache, reference, 0, positions_for(0, 2), gen)
    forward(cache, reference, 2, positions_for(2, 2), gen)


@pytest.mark.parametrize("bad, message", [
    (dict(batch_size=0), "got 0, 10 and 1"),
    (dict(capacity=0), "got 3, 0 and 1"),
    (dict(spare=-1), "got 3, 10 and -1"),
])
def test_bad_sizes_are_refused_naming_what_is_accepted(bad, message) -> None:
    with pytest.raises(ValueError, match=r"^a cache needs batch_size >= 1, capacity >= 1 and spare >= 0, " + message):
        new_cache(**bad)


def test_the_smallest_sizes_are_accepted() -> None:
    cache = StaticKVCache(layers=[LayerShape(layer_index=0, n_kv_heads=1, head_dim=1)], batch_size=1, capacity=1)
    assert cache.slot_counts() == {0: 1}
    assert cache.spare == 0


def test_a_cache_without_layers_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^a cache needs at least one layer that keeps something \(per token or per sequence\)$"):
        new_cache(layers=[])


def test_buffers_cursor_and_positions_live_on_the_given_device_in_the_given_dtype() -> None:
    # The meta device stands in for an accelerator: every tensor the cache makes must be there.
    cache = new_cache(device="meta", dtype=torch.bfloat16)
    assert cache.cursor.device.type == "meta" and cache.cursor.dtype == torch.long
    positions = torch.zeros(B, 2, dtype=torch.long, device="meta")
    for index, (heads, dim, vheads, vdim) in {1: (1, 2, 3, 5), 2: (2, 3, 2, 3), 4: (2, 3, 2, 3)}.items():
        key = torch.zeros(B, heads, 2, dim, dtype=torch.bfloat16, device="meta")
        value = torch.zeros(B, vheads, 2, vdim, dtype=torch.bfloat16, device="meta")
        keys, values, read = cache.update(index, key, value, positions)
        assert keys.device.type == values.device.type == read.device.type == "meta"
        assert keys.dtype == values.dtype == torch.bfloat16 and read.dtype == torch.long
    assert cache.cursor.device.type == "meta"


def test_float32_is_the_default_dtype() -> None:
    cache = StaticKVCache(layers=[LayerShape(layer_index=0, n_kv_heads=1, head_dim=2)], batch_size=1, capacity=2)
    keys, values, _ = cache.update(0, torch.ones(1, 1, 1, 2), torch.ones(1, 1, 1, 2), torch.tensor([[0]]))
    assert keys.dtype == values.dtype == torch.float32
    assert cache.nbytes == 2 * 4 * 2 * 2 + 8 * 2


def test_layer_shape_of_reads_what_an_attention_declares() -> None:
    declared = SimpleNamespace(layer_index=3, window=7, cache_slots=CacheSlots(key_heads=1, key_dim=4, value_heads=2,
                                                                                 value_dim=6))
    assert LayerShape.of(declared) == LayerShape(layer_index=3, n_kv_heads=1, head_dim=4, window=7, value_heads=2,
                                                 value_dim=6)
    plain = SimpleNamespace(layer_index=0, window=None, n_kv_heads=2, head_dim=8)  # no declaration: keys and values
    assert LayerShape.of(plain) == LayerShape(layer_index=0, n_kv_heads=2, head_dim=8, window=None, value_heads=2,
                                              value_dim=8)
    assert LayerShape.of(SimpleNamespace(layer_index=1, window=None, cache_slots=None)) is None


def windowed_model():
    """Two layers of the tiny spec, the second with a window of 3."""
    data = tiny_with()
    data["model"]["layers"] = [{"select": "1", "mixer": {"window": 3}}]
    return specformer.build(data, seed=0)


def test_for_model_sizes_every_layer_and_takes_the_model_dtype_and_device() -> None:
    model = windowed_model().to(torch.float64)
    cache = StaticKVCache.for_model(model, batch_size=2, capacity=8, spare=2)
    assert cache.slot_counts() == {0: 8, 1: 5}  # window 3 + 2 spare
    assert (cache.batch_size, cache.capacity, cache.spare) == (2, 8, 2)
    key = torch.zeros(2, 2, 1, 8, dtype=torch.float64)
    keys, values, _ = cache.update(0, key, key, torch.tensor([[0], [0]]))
    assert keys.dtype == values.dtype == torch.float64
    assert keys.shape == values.shape == (2, 2, 8, 8)  # (B, n_kv_heads, capacity, head_dim 32 / 4)
    assert StaticKVCache.for_model(model, batch_size=1, capacity=8, dtype=torch.bfloat16).update(
        0, key[:1].bfloat16(), key[:1].bfloat16(), torch.tensor([[0]]))[0].dtype == torch.bfloat16
    default = StaticKVCache.for_model(model, batch_size=1, capacity=8)  # no spare unless asked: the window exactly
    assert default.slot_counts() == {0: 8, 1: 3} and default.spare == 0
    on_meta = StaticKVCache.for_model(model.to("meta"), batch_size=1, capacity=8)
    assert on_meta.cursor.device.type == "meta"
    assert StaticKVCache.for_model(windowed_model(), batch_size=1, capacity=8, device="meta").cursor.device.type == "meta"


def test_the_cache_makes_its_index_tensors_on_its_own_device_not_the_default_one() -> None:
    """Under another default device (meta standing in for an accelerator) a CPU cache works unchanged."""

    def run(cache: StaticKVCache) -> list[torch.Tensor]:
        seen = []
        for column, length in ((0, 5), (5, 1), (6, 1)):
            positions = torch.arange(column, column + length, device="cpu").repeat(B, 1)
            for index, (heads, dim, vheads, vdim) in {1: (1, 2, 3, 5), 2: (2, 3, 2, 3), 4: (2, 3, 2, 3)}.items():
                key = torch.full((B, heads, length, dim), float(column), dtype=torch.float64, device="cpu")
                value = torch.full((B, vheads, length, vdim), -float(column), dtype=torch.float64, device="cpu")
                seen += cache.update(index, key, value, positions)
        cache.rollback(6)
        cache.reorder(torch.tensor([2, 0, 1], device="cpu"))
        one = torch.ones(B, 1, 1, 2, dtype=torch.float64, device="cpu")
        seen += cache.update(1, one, torch.ones(B, 3, 1, 5, dtype=torch.float64, device="cpu"), positions)
        return seen

    expected = run(new_cache())
    cache = new_cache()
    with torch.device("meta"):
        got = run(cache)
    assert all(g.device.type == "cpu" for g in got)
    assert all(torch.equal(g, e) for g, e in zip(got, expected))
    assert int(cache.cursor) == 7


def test_every_kind_an_example_spec_names_goes_through_the_cache_in_the_default_suite() -> None:
    """The examples left to the slow suite (specs_for_tests.repeated_specs) take nothing with them:
    every component kind, flag and word of a default-suite example spec's file is in one that runs by default."""
    from specformer.spec import read_spec_file

    from .specs_for_tests import SLOW_SPECS, SPEC_FILES, repeated_specs, small_version, spec_features

    slow = SLOW_SPECS | repeated_specs()
    assert slow - SLOW_SPECS, "no example spec repeats another's mechanisms: the selection found nothing to leave out"
    written = {p.name: {"model": read_spec_file(p)["model"]} for p in SPEC_FILES if p.name not in SLOW_SPECS}
    running: set[str] = set()
    for name, data in written.items():
        if name not in slow:
            running |= spec_features(small_version(data))
    for name in sorted(set(written) & slow):
        assert spec_features(written[name]) <= running, (name, sorted(spec_features(written[name]) - running))
