"""The parallel mixer: the multiplied sum of its sub-mixers, the facts it declares, cached == uncached."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError
from torch import Tensor

import specformer
from fixtures.recurrent import registry_with_decaying_sum
from specformer.model.context import ForwardContext
from specformer.model.state import StateSlots
from specformer.registry.components import Resolved
from specformer.registry.discovery import get_registry
from specformer_generate.cache import LayerShape, StateShape, StaticKVCache
from specformer_layers.mixers.parallel import ParallelMixer
from specformer_layers.mixers.parallel_params import ParallelMixerParams
from specformer_layers.positional.params import RotaryPositionsParams
from specformer_layers.positional.rope import RotaryPositions

from ..support import tiny_spec_over_vocab

D_MODEL = 12
HEADS, HEAD_DIM = 3, 4


def decay_sum(**params: int) -> Resolved:
    """The test suite's recurrent mixer (a decaying sum per channel, tests/fixtures/recurrent.py)."""
    return registry_with_decaying_sum().resolve("mixer", {"kind": "decaying_sum", "width": 5, **params})


def attention(**params: object) -> Resolved:
    return get_registry().resolve("mixer", {"kind": "attention", "n_heads": HEADS, **params})


def mixer(*refs: Resolved, ins: list[float] | None = None, outs: list[float] | None = None,
          layer_index: int = 0) -> ParallelMixer:
    torch.manual_seed(0)
    params = ParallelMixerParams(mixers=list(refs), in_multipliers=ins, out_multipliers=outs)
    return ParallelMixer(params, d_model=D_MODEL, layer_index=layer_index).double()


def context(positions: Tensor, cache: object = None) -> ForwardContext:
    rope = RotaryPositions(RotaryPositionsParams(), head_dim=HEAD_DIM, context_length=64)
    return ForwardContext(positions=positions, positional=rope, positional_state=rope.prepare(positions), cache=cache)


def test_the_sum_of_the_multiplied_sub_mixers() -> None:
    layer = mixer(attention(), decay_sum(), ins=[0.5, 3.0], outs=[-2.0, 0.25])
    x = torch.randn(2, 7, D_MODEL, dtype=torch.float64)
    ctx = context(torch.arange(7).expand(2, 7))
    first, second = layer.mixers
    expected = -2.0 * first(x * 0.5, ctx) + 0.25 * second(x * 3.0, ctx)
    torch.testing.assert_close(layer(x, ctx), expected, rtol=1e-12, atol=1e-12)


def test_multipliers_default_to_one() -> None:
    layer = mixer(decay_sum(), attention())
    x = torch.randn(1, 4, D_MODEL, dtype=torch.float64)
    ctx = context(torch.arange(4)[None])
    torch.testing.assert_close(layer(x, ctx), layer.mixers[0](x, ctx) + layer.mixers[1](x, ctx))


def test_facts_come_from_the_one_that_keeps_keys_and_the_recurrent_one() -> None:
    layer = mixer(decay_sum(width=6), attention(n_kv_heads=1, window=5), layer_index=3)
    assert (layer.n_heads, layer.n_kv_heads, layer.head_dim, layer.window) == (HEADS, 1, HEAD_DIM, 5)
    assert layer.cache_slots is not None and layer.cache_slots.key_heads == 1
    assert layer.state_slots == StateSlots((("sum", (6,)),))
    assert layer.recurrent_flops_per_token == 3 * 6  # the decaying sum's, passed on for the summary
    assert layer.uses_positions
    assert all(m.layer_index == 3 for m in layer.mixers)
    alone = mixer(decay_sum(width=6))
    assert (alone.cache_slots, alone.window, alone.uses_positions) == (None, None, False)


@pytest.mark.parametrize(("refs", "what"), [
    ((attention(), attention()), "at most one sub-mixer may keep keys per token"),
    ((decay_sum(), decay_sum()), "at most one sub-mixer may keep a recurrent state"),
])
def test_two_of_a_kind_are_refused_in_one_line(refs: tuple[Resolved, ...], what: str) -> None:
    with pytest.raises(ValueError, match=what) as caught:
        mixer(*refs)
    assert "\n" not in str(caught.value) and "mixers[1]" in str(caught.value)


def test_one_multiplier_per_mixer() -> None:
    with pytest.raises(ValidationError, match="in_multipliers has 1 entries for 2 mixers"):
        ParallelMixerParams(mixers=[attention(), decay_sum()], in_multipliers=[1.0])


@pytest.mark.parametrize("order", ["attention first", "recurrence first"])
def test_cached_decoding_matches_the_full_forward(order: str) -> None:
    refs = (attention(n_kv_heads=1), decay_sum()) if order == "attention first" else (decay_sum(), attention(n_kv_heads=1))
    layer = mixer(*refs, ins=[1.5, 0.5], outs=[0.75, 2.0])
    x = torch.randn(2, 9, D_MODEL, dtype=torch.float64)
    # Row 1 opens with two padding tokens: its real tokens are x[1, 2:] at positions 0..6.
    positions = torch.stack((torch.arange(9), torch.arange(-2, 7)))
    full = torch.cat((layer(x[:1], context(positions[:1])), layer(x[1:, 2:], context(torch.arange(7)[None]))), dim=1)
    cache = StaticKVCache(layers=[LayerShape.of(layer)], states=[StateShape.of(layer)], batch_size=2, capacity=9,
                          dtype=torch.float64)
    prefill = layer(x[:, :5], context(positions[:, :5], cache))
    steps = [layer(x[:, t:t + 1], context(positions[:, t:t + 1], cache)) for t in range(5, 9)]
    cached = torch.cat((prefill, *steps), dim=1)
    torch.testing.assert_close(cached[:1], full[:, :9], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(cached[1:, 2:], full[:, 9:], rtol=1e-10, atol=1e-10)


def test_a_spec_builds_it_and_the_model_caches_it() -> None:
    """Through specformer.build, with the only built-in sub-mixer: attention alone, input and output scaled."""
    spec = tiny_spec_over_vocab()
    spec["model"]["block"]["mixer"] = {"kind": "parallel", "mixers": [{"kind": "attention", "n_heads": 4}],
                                           "in_multipliers": [0.5], "out_multipliers": [3.0]}
    model = specformer.build(spec, seed=0, dtype=torch.float64).eval()
    assert isinstance(model.blocks[0].mixer, ParallelMixer)
    ids = torch.randint(0, 61, (1, 6))
    with torch.no_grad():
        full = model(ids)
        cache = StaticKVCache.for_model(model, batch_size=1, capacity=6)
        prefill = model(ids[:, :4], positions=torch.arange(4)[None], cache=cache)
        last = [model(ids[:, t:t + 1], positions=torch.tensor([[t]]), cache=cache) for t in (4, 5)]
    torch.testing.assert_close(torch.cat((prefill, *last), dim=1), full, rtol=1e-9, atol=1e-9)


# -- with the built-in recurrent mixer: Falcon-H1's Mamba-2 beside attention ---------------------------

def mamba2(**params: object) -> Resolved:
    return get_registry().resolve("mixer", {"kind": "mamba2", "n_heads": 4, "head_dim": 6, "state_size": 8,
                                                "n_groups": 2, "conv_kernel": 3, "chunk": 4, **params})


def test_mamba2_beside_attention_is_the_multiplied_sum() -> None:
    layer = mixer(mamba2(projection_multipliers=[0.5, 1.5, 0.9, 1.1, 0.7]), attention(n_kv_heads=1),
                  ins=[1.25, 0.8], outs=[0.25, 1.5])
    x = torch.randn(2, 9, D_MODEL, dtype=torch.float64)
    ctx = context(torch.arange(9).expand(2, 9))
    ssm, attn = layer.mixers
    torch.testing.assert_close(layer(x, ctx), 0.25 * ssm(x * 1.25, ctx) + 1.5 * attn(x * 0.8, ctx),
                               rtol=1e-12, atol=1e-12)
    assert layer.state_slots == ssm.state_slots and layer.cache_slots is not None
    assert (layer.n_heads, layer.head_dim) == (HEADS, HEAD_DIM)  # the attention's, not the scan's


def falcon_like_spec() -> dict:
    spec = tiny_spec_over_vocab()
    spec["model"]["block"]["mixer"] = {
        "kind": "parallel",
        "mixers": [{"kind": "mamba2", "n_heads": 4, "head_dim": 8, "state_size": 8, "n_groups": 2, "conv_kernel": 4,
                    "chunk": 4, "gated_norm": False},
                   {"kind": "attention", "n_heads": 4, "n_kv_heads": 2}],
        "in_multipliers": [1.25, 0.8], "out_multipliers": [0.5, 1.5]}
    return spec


def test_a_model_of_parallel_blocks_decodes_through_the_cache_as_it_computes_in_full() -> None:
    """Prefill 3, a chunk of 2, then token by token, left-padded rows; float32 (Mamba-2 scans in float32)."""
    model = specformer.build(falcon_like_spec(), seed=0).eval()
    ids = torch.randint(0, 61, (2, 10), generator=torch.Generator().manual_seed(3))
    padding = 2  # row 1 opens with two padding tokens; its real tokens are ids[1, 2:]
    positions = torch.stack((torch.arange(10), torch.arange(-padding, 10 - padding)))
    with torch.no_grad():
        full = [model(ids[:1]), model(ids[1:, padding:])]
        cache = StaticKVCache.for_model(model, batch_size=2, capacity=10)
        out, start = [], 0
        for size in (3, 2, 1, 1, 1, 1, 1):
            out.append(model(ids[:, start:start + size], positions=positions[:, start:start + size], cache=cache))
            start += size
    cached = torch.cat(out, dim=1)
    torch.testing.assert_close(cached[:1], full[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cached[1:, padding:], full[1], rtol=1e-5, atol=1e-5)


def test_rollback_of_parallel_blocks_restores_keys_and_states() -> None:
    """Speculative decoding's pattern: keep steps, verify 3 tokens, drop 2, continue: as if never written."""
    model = specformer.build(falcon_like_spec(), seed=0).eval()
    ids = torch.randint(0, 61, (1, 9), generator=torch.Generator().manual_seed(4))
    positions = torch.arange(9)[None]
    with torch.no_grad():
        cache = StaticKVCache.for_model(model, batch_size=1, capacity=12, spare=3)
        model(ids[:, :5], positions=positions[:, :5], cache=cache)
        cache.keep_steps = True
        drafted = torch.tensor([[7, 8, 9]])
        model(torch.cat((ids[:, 5:6], drafted[:, :2]), 1), positions=positions[:, 5:8], cache=cache)
        cache.rollback(6)  # keep the one verified token
        rest = model(ids[:, 6:9], positions=positions[:, 6:9], cache=cache)
        full = model(ids)
    torch.testing.assert_close(rest, full[:, 6:9], rtol=1e-5, atol=1e-5)

