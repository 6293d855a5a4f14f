"""The serve engine with cross-layer KV sharing: the reading layers have no paged blocks of their own."""

from __future__ import annotations

import random

import specformer
from fixtures.tiny import tiny_spec
from specformer_generate import generate
from specformer_generate.samplers.pipeline import build_sampler
from specformer_serve.engine import Engine, SequenceRequest
from specformer_serve.paged_cache import cached_layers

from .test_engine import Collector


def test_the_serve_engine_batches_a_shared_kv_model_as_it_runs_each_request_alone() -> None:
    """Layers 2 and 3 read layer 1's keys (a window of 5 on all, so the ring of layer 1 serves them); batched == alone."""
    spec = tiny_spec(vocab_size=61, n_layers=4, block={"attention": {"kind": "attention", "n_heads": 4, "n_kv_heads": 2,
                                                                     "window": 5}},
                     layers=[{"select": "2:", "attention": {"kv_from": 1}}])
    model = specformer.build(spec, seed=6).eval()
    assert [layer.layer_index for layer in cached_layers(model)] == [0, 1]  # no blocks for layers 2 and 3
    rng = random.Random(2)
    prompts = [[rng.randrange(61) for _ in range(rng.randrange(1, 9))] for _ in range(5)]
    engine = Engine(model, max_batch=3, num_blocks=64, block_size=4).start()
    collector = Collector()
    try:
        for i, prompt in enumerate(prompts):
            engine.submit(SequenceRequest(prompt=prompt, max_new_tokens=4, sampler=build_sampler(None), seed=None,
                                          eos=frozenset(), emit=collector.emit_for(i)))
        collector.wait(len(prompts))
    finally:
        engine.stop()
    for i, prompt in enumerate(prompts):
        assert collector.tokens[i] == generate(model, [prompt], max_new_tokens=4)[0][len(prompt):], f"request {i}"
    assert engine.largest_batch > 1
