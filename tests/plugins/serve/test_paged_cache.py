"""The paged KV cache: block bookkeeping, what update() stores and returns, and a model run through it."""

from __future__ import annotations

import pytest
import torch

import specformer
from specformer.model.attention import CacheSlots
from specformer_serve.paged_cache import NULL_BLOCK, BlockPool, CachedLayer, PagedKVCache

from .conftest import served_spec


def test_the_pool_hands_out_each_block_once_and_takes_them_back() -> None:
    pool = BlockPool(num_blocks=3, block_size=4)
    got = [pool.allocate() for _ in range(3)]
    assert sorted(got) == [1, 2, 3] and NULL_BLOCK not in got
    assert pool.free == 0
    with pytest.raises(RuntimeError, match="empty"):
        pool.allocate()
    pool.release(got[:2])
    assert pool.free == 2
    with pytest.raises(ValueError, match="already free"):
        pool.release([got[0]])
    with pytest.raises(ValueError, match="not a block of this pool"):
        pool.release([NULL_BLOCK])
    assert pool.blocks_for(1) == 1 and pool.blocks_for(4) == 1 and pool.blocks_for(5) == 2


@pytest.mark.parametrize("num_blocks, block_size", [(0, 4), (3, 0), (True, 4)])
def test_a_pool_needs_positive_sizes(num_blocks, block_size) -> None:
    with pytest.raises(ValueError, match="needs"):
        BlockPool(num_blocks=num_blocks, block_size=block_size)


def _cache(block_size: int = 2) -> PagedKVCache:
    slots = CacheSlots(key_heads=1, key_dim=2, value_heads=2, value_dim=3)  # keys and values may differ
    return PagedKVCache(layers=[CachedLayer(layer_index=0, slots=slots)], num_blocks=4, block_size=block_size)


def test_update_writes_each_row_into_its_own_blocks_and_reads_them_back_in_order() -> None:
    cache = _cache()
    # Row 0 owns blocks [3, 1] (non-contiguous, out of order), row 1 owns [2].
    cache.plan([[3, 1], [2]], [0, 0], 2)
    k = torch.arange(2 * 1 * 2 * 2, dtype=torch.float32).reshape(2, 1, 2, 2)  # (B, heads, T, dim)
    v = -torch.arange(2 * 2 * 2 * 3, dtype=torch.float32).reshape(2, 2, 2, 3)
    keys, values, positions = cache.update(0, k, v, torch.tensor([[0, 1], [0, 1]]))
    # Row 0 reads blocks 3 and 1 (4 slots), row 1 block 2 then the null block.
    assert keys.shape == (2, 1, 4, 2) and values.shape == (2, 2, 4, 3)
    assert positions.tolist() == [[0, 1, -1, -1], [0, 1, -1, -1]]
    torch.testing.assert_close(keys[:, :, :2], k)
    torch.testing.assert_close(values[:, :, :2], v)
    # One more token for row 0 lands in its second block (1), after the two in block 3.
    cache.plan([[3, 1]], [2], 1)
    k2, v2 = torch.full((1, 1, 1, 2), 7.0), torch.full((1, 2, 1, 3), 8.0)
    keys, values, positions = cache.update(0, k2, v2, torch.tensor([[2]]))
    assert positions.tolist() == [[0, 1, 2, -1]]
    torch.testing.assert_close(keys[0, :, :2], k[0])
    torch.testing.assert_close(keys[0, :, 2], k2[0, :, 0])
    torch.testing.assert_close(values[0, :, 2], v2[0, :, 0])
    assert cache.slot_positions[1 * 2].item() == 2  # block 1, first slot


def test_freed_blocks_are_empty_for_their_next_owner() -> None:
    cache = _cache()
    blocks = [cache.pool.allocate(), cache.pool.allocate()]
    cache.plan([blocks], [0], 3)
    cache.update(0, torch.ones(1, 1, 3, 2), torch.ones(1, 2, 3, 3), torch.tensor([[0, 1, 2]]))
    cache.free(blocks)
    assert cache.pool.free == 4
    assert (cache.slot_positions == -1).all()  # a new owner's mask can never reach the old keys


def test_plan_refuses_a_row_without_blocks_for_its_tokens() -> None:
    cache = _cache()
    with pytest.raises(ValueError, match="too few"):
        cache.plan([[1]], [1], 2)


def test_a_model_decoding_through_the_paged_cache_gives_the_logits_of_a_full_forward() -> None:
    """Reference: the model run on each whole sequence without a cache (causal attention over everything)."""
    model = specformer.build(served_spec(positional={"kind": "rope"}), seed=1).eval()
    cache = PagedKVCache.for_model(model, num_blocks=16, block_size=3)
    prompts = [[5, 9, 2, 7, 1], [3, 3]]
    follow = [[4, 8, 6, 2], [9, 1, 5, 7]]
    tables = [[cache.pool.allocate() for _ in range(3)], [cache.pool.allocate() for _ in range(2)]]
    with torch.inference_mode():
        for row, prompt in enumerate(prompts):  # prefill each prompt alone, as the engine does
            cache.plan([tables[row]], [0], len(prompt))
            model(torch.tensor([prompt]), positions=torch.arange(len(prompt))[None], cache=cache)
        lengths = [len(p) for p in prompts]
        for step in range(4):  # then decode both rows together, each at its own position
            cache.plan(tables, lengths, 1)
            tokens = torch.tensor([[f[step]] for f in follow])
            logits = model(tokens, positions=torch.tensor(lengths)[:, None], cache=cache)[:, -1]
            for row in range(2):
                full = torch.tensor([prompts[row] + follow[row][: step + 1]])
                torch.testing.assert_close(logits[row], model(full)[0, -1], rtol=1e-5, atol=1e-5)
            lengths = [n + 1 for n in lengths]


def test_a_sliding_window_model_reads_only_its_window_through_the_cache() -> None:
    spec = served_spec()
    spec["model"]["block"]["mixer"]["window"] = 3
    model = specformer.build(spec, seed=2).eval()
    cache = PagedKVCache.for_model(model, num_blocks=8, block_size=2)
    sequence = [7, 3, 9, 1, 4, 6, 2]
    table = [cache.pool.allocate() for _ in range(4)]
    with torch.inference_mode():
        cache.plan([table], [0], 2)
        model(torch.tensor([sequence[:2]]), positions=torch.arange(2)[None], cache=cache)
        for n in range(2, len(sequence)):
            cache.plan([table], [n], 1)
            logits = model(torch.tensor([[sequence[n]]]), positions=torch.tensor([[n]]), cache=cache)[0, -1]
            torch.testing.assert_close(logits, model(torch.tensor([sequence[: n + 1]]))[0, -1], rtol=1e-5, atol=1e-5)


def test_left_padded_rows_write_their_padding_to_the_null_block() -> None:
    """A prefill of prompts of different lengths: padding columns go nowhere anyone reads."""
    model = specformer.build(served_spec(), seed=4).eval()
    cache = PagedKVCache.for_model(model, num_blocks=8, block_size=2)
    prompts = [[4, 9, 1, 7], [6]]
    tables = [[cache.pool.allocate(), cache.pool.allocate()], [cache.pool.allocate()]]
    cache.plan(tables, [0, 0], [4, 1])
    ids = torch.tensor([prompts[0], [0, 0, 0, 6]])
    positions = torch.tensor([[0, 1, 2, 3], [-1, -1, -1, 0]])
    with torch.inference_mode():
        logits = model(ids, positions=positions, cache=cache, last_only=True)[:, -1]
        for row, prompt in enumerate(prompts):
            torch.testing.assert_close(logits[row], model(torch.tensor([prompt]))[0, -1], rtol=1e-5, atol=1e-5)
    assert cache.slot_positions[: cache.block_size].tolist() == [-1, -1]  # the null block stayed empty
    assert cache.slot_positions[tables[1][0] * 2].item() == 0  # row 1's one real token, in its own block
