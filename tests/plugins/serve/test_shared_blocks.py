"""The serve engine with a shared block (model.shared_blocks): a paged cache per use, batched as alone."""

from __future__ import annotations

import random

import specformer
from fixtures.tiny import tiny_spec
from specformer_serve.paged_cache import cached_layers

from .test_engine import assert_greedy_batched_equals_alone


def test_the_serve_engine_keeps_a_cache_per_use_of_a_shared_block() -> None:
    """One shared attention block before layers 1 and 2 of three: slots 3 and 4 beside the layers' 0..2."""
    spec = tiny_spec(vocab_size=61, n_layers=3,
                     shared_blocks={"attn": {"norm": "rmsnorm", "mixer": {"kind": "attention", "n_heads": 2},
                                             "ffn": {"kind": "mlp", "hidden": 24}}},
                     layers=[{"select": "1:", "shared": "attn"}])
    model = specformer.build(spec, seed=6).eval()
    assert [layer.layer_index for layer in cached_layers(model)] == [0, 1, 2, 3, 4]
    rng = random.Random(3)
    prompts = [[rng.randrange(61) for _ in range(rng.randrange(1, 9))] for _ in range(5)]
    assert_greedy_batched_equals_alone(model, prompts, [4] * len(prompts), max_batch=3)
