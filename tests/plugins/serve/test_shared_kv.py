"""The serve engine with cross-layer KV sharing: the reading layers have no paged blocks of their own."""

from __future__ import annotations

import random

import specformer
from fixtures.tiny import tiny_spec
from specformer_serve.paged_cache import cached_layers

from .test_engine import assert_greedy_batched_equals_alone


def test_the_serve_engine_batches_a_shared_kv_model_as_it_runs_each_request_alone() -> None:
    """Layers 2 and 3 read layer 1's keys (a window of 5 on all, so the ring of layer 1 serves them); batched == alone."""
    spec = tiny_spec(vocab_size=61, n_layers=4, block={"mixer": {"kind": "attention", "n_heads": 4, "n_kv_heads": 2,
                                                                     "window": 5}},
                     layers=[{"select": "2:", "mixer": {"kv_from": 1}}])
    model = specformer.build(spec, seed=6).eval()
    assert [layer.layer_index for layer in cached_layers(model)] == [0, 1]  # no blocks for layers 2 and 3
    rng = random.Random(2)
    prompts = [[rng.randrange(61) for _ in range(rng.randrange(1, 9))] for _ in range(5)]
    assert_greedy_batched_equals_alone(model, prompts, [4] * len(prompts), max_batch=3)
