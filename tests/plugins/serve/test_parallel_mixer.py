"""The serve engine with parallel mixers: a layer that keeps keys in paged blocks and a state in a slot."""

from __future__ import annotations

import random

import specformer
from fixtures.recurrent import registry_with_decaying_sum
from fixtures.tiny import tiny_spec
from .test_engine import assert_greedy_batched_equals_alone


def test_the_serve_engine_batches_parallel_blocks_as_it_runs_each_request_alone() -> None:
    """Keys in paged blocks and the decaying sum's state in a slot, for the same layers; batched == alone."""
    spec = tiny_spec(vocab_size=61)
    spec["model"]["block"]["mixer"] = {"kind": "parallel", "mixers": [{"kind": "decaying_sum", "width": 6},
                                                                          {"kind": "attention", "n_heads": 4}],
                                           "in_multipliers": [1.5, 1.0], "out_multipliers": [0.5, 2.0]}
    model = specformer.build(spec, registry=registry_with_decaying_sum(), seed=5).eval()
    rng = random.Random(1)
    prompts = [[rng.randrange(61) for _ in range(rng.randrange(1, 9))] for _ in range(5)]
    assert_greedy_batched_equals_alone(model, prompts, [4] * len(prompts), max_batch=3)
