"""Continuous batching: batched results equal each request alone, admission control, no block leak, cancel."""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest

from specformer_generate import generate
from specformer_generate.samplers.pipeline import build_sampler
from specformer_serve.engine import EndEvent, Engine, SequenceRequest, TokenEvent

from .conftest import EOT

SAMPLERS: list[Any] = [
    None,  # greedy
    [{"kind": "top_p", "p": 0.9}, {"kind": "temperature", "value": 0.8}],
    [{"kind": "frequency_penalty", "penalty": 0.5}, {"kind": "presence_penalty", "penalty": 0.3}],
    [{"kind": "frequency_penalty", "penalty": 1.0}, "greedy"],
]


class Collector:
    """The tokens and the end event of every submitted request, waited for together."""

    def __init__(self) -> None:
        self.tokens: dict[int, list[int]] = {}
        self.ends: dict[int, EndEvent] = {}
        self._done = threading.Condition()

    def emit_for(self, key: int):
        self.tokens[key] = []

        def emit(event: Any) -> None:
            if isinstance(event, TokenEvent):
                self.tokens[key].append(event.token)
            else:
                with self._done:
                    self.ends[key] = event
                    self._done.notify_all()

        return emit

    def wait(self, count: int, timeout: float = 120) -> None:
        with self._done:
            assert self._done.wait_for(lambda: len(self.ends) >= count, timeout=timeout), "requests did not finish"


def assert_greedy_batched_equals_alone(model: Any, prompts: list[list[int]], lengths: list[int], *, max_batch: int,
                                       num_blocks: int = 64, block_size: int = 4) -> Engine:
    """Greedy requests served together give what ``generate`` gives each alone, and were batched; the stopped engine."""
    engine = Engine(model, max_batch=max_batch, num_blocks=num_blocks, block_size=block_size).start()
    collector = Collector()
    try:
        for i, (prompt, n) in enumerate(zip(prompts, lengths)):
            engine.submit(SequenceRequest(prompt=prompt, max_new_tokens=n, sampler=build_sampler(None), seed=None,
                                          eos=frozenset(), emit=collector.emit_for(i)))
        collector.wait(len(prompts))
    finally:
        engine.stop()
    for i, (prompt, n) in enumerate(zip(prompts, lengths)):
        assert collector.tokens[i] == generate(model, [prompt], max_new_tokens=n)[0][len(prompt):], f"request {i}"
    assert engine.largest_batch > 1
    return engine


def _requests(count: int, seed: int = 0, longest: int = 40) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{"prompt": [rng.randrange(256) for _ in range(rng.randrange(1, 30))], "max_new_tokens": rng.randrange(1, longest),
             "sampler": SAMPLERS[i % len(SAMPLERS)], "seed": 1000 + i} for i in range(count)]


def _alone(model: Any, r: dict[str, Any]) -> list[int]:
    out = generate(model, [r["prompt"]], max_new_tokens=r["max_new_tokens"], sampler=r["sampler"], seed=r["seed"],
                   eos_token_id=EOT)[0]
    return out[len(r["prompt"]):]


def _run(engine: Engine, requests: list[dict[str, Any]]) -> Collector:
    collector = Collector()
    for i, r in enumerate(requests):
        engine.submit(SequenceRequest(prompt=r["prompt"], max_new_tokens=r["max_new_tokens"],
                                      sampler=build_sampler(r["sampler"]), seed=r["seed"], eos=frozenset([EOT]),
                                      emit=collector.emit_for(i)))
    collector.wait(len(requests))
    return collector


def test_sixteen_requests_batched_give_exactly_what_each_gives_alone(model) -> None:
    requests = _requests(16)
    engine = Engine(model, max_batch=16, num_blocks=256, block_size=8).start()
    try:
        collector = _run(engine, requests)
    finally:
        engine.stop()
    for i, r in enumerate(requests):
        assert collector.tokens[i] == _alone(model, r), f"request {i} ({r['sampler']})"
        assert collector.ends[i].reason == ("stop" if collector.tokens[i][-1] == EOT else "length")
    assert engine.largest_batch > 4, "the requests were never batched together"
    assert engine.pool.free == engine.pool.num_blocks


def test_when_blocks_run_short_requests_wait_and_none_is_dropped_or_corrupted(model) -> None:
    """A pool for about two requests at a time: the rest queue, and every result is still exact."""
    requests = _requests(10, seed=1)
    engine = Engine(model, max_batch=16, num_blocks=18, block_size=4).start()  # 72 tokens; a request needs <= 68
    try:
        collector = _run(engine, requests)
    finally:
        engine.stop()
    for i, r in enumerate(requests):
        assert collector.tokens[i] == _alone(model, r), f"request {i}"
    assert engine.largest_batch < len(requests), "admission control let everything in at once"
    assert engine.pool.free == engine.pool.num_blocks


def test_no_block_leaks_after_a_hundred_requests(model) -> None:
    engine = Engine(model, max_batch=8, num_blocks=64, block_size=4).start()
    try:
        collector = Collector()
        handles = []
        for i, r in enumerate(_requests(100, seed=2, longest=12)):
            handles.append(engine.submit(SequenceRequest(
                prompt=r["prompt"], max_new_tokens=r["max_new_tokens"], sampler=build_sampler(r["sampler"]),
                seed=r["seed"], eos=frozenset([EOT]), emit=collector.emit_for(i))))
        for handle in handles[::7]:  # some clients go away, queued or running
            handle.cancel()
        collector.wait(100)
        assert {e.reason for e in collector.ends.values()} <= {"stop", "length", "cancelled"}
        assert any(e.reason == "cancelled" for e in collector.ends.values())
        stats = engine.stats()
    finally:
        engine.stop()
    assert stats["free_blocks"] == stats["total_blocks"] == 64
    assert stats["running"] == stats["waiting"] == 0


def test_a_cancelled_request_ends_at_once_and_frees_its_blocks(model) -> None:
    engine = Engine(model, max_batch=4, num_blocks=32, block_size=4).start()
    try:
        collector = Collector()
        first = threading.Event()
        emit = collector.emit_for(0)

        def on_event(event: Any) -> None:
            emit(event)
            first.set()

        handle = engine.submit(SequenceRequest(prompt=[1, 2, 3], max_new_tokens=90, sampler=build_sampler(None),
                                               emit=on_event))
        assert first.wait(30)
        handle.cancel()
        collector.wait(1)
        assert collector.ends[0].reason == "cancelled"
        assert len(collector.tokens[0]) < 90
        assert engine.stats()["free_blocks"] == 32
    finally:
        engine.stop()


def test_check_refuses_what_can_never_run(model) -> None:
    engine = Engine(model, max_batch=2, num_blocks=4, block_size=4)  # 16 tokens of cache
    with pytest.raises(ValueError, match="empty"):
        engine.check(0, 5)
    with pytest.raises(ValueError, match="context"):
        engine.check(model.context_length, 1)
    with pytest.raises(ValueError, match=r"max_tokens <= 86"):
        engine.check(10, 87)
    with pytest.raises(ValueError, match="whole KV cache holds \\(16 tokens"):
        engine.check(10, 7)
    engine.check(10, 6)


def test_a_model_error_ends_its_requests_and_the_engine_goes_on(model) -> None:
    class Flaky:
        """The model, but its first decode forward raises."""

        def __init__(self) -> None:
            self.failed = False

        def __getattr__(self, name: str) -> Any:
            return getattr(model, name)

        def __call__(self, ids, **kwargs):
            if ids.shape[1] == 1 and not self.failed:
                self.failed = True
                raise RuntimeError("boom")
            return model(ids, **kwargs)

    engine = Engine(Flaky(), max_batch=4, num_blocks=32, block_size=4).start()
    try:
        collector = _run(engine, [{"prompt": [1, 2], "max_new_tokens": 5, "sampler": None, "seed": None}])
        assert collector.ends[0].reason == "error" and "boom" in collector.ends[0].message
        request = {"prompt": [4, 5, 6], "max_new_tokens": 5, "sampler": None, "seed": None}
        again = _run(engine, [request])
        assert again.tokens[0] == _alone(model, request)
        assert engine.pool.free == 32
    finally:
        engine.stop()


#: Attention layouts the paged cache must hold: sliding windows, multi-query with ALiBi, per-layer
#: mixes, and latent attention (which caches a compressed latent and a rotary key, not keys and values), with and
#: without an indexer.
ARCHITECTURES = {
    "window": {"block": {"mixer": {"kind": "attention", "n_heads": 4, "n_kv_heads": 2, "window": 5}}},
    "mqa-alibi": {"positional": {"kind": "alibi"},
                  "block": {"mixer": {"kind": "attention", "n_heads": 4, "n_kv_heads": 1}}},
    "per-layer-window": {"layers": [{"select": 0, "mixer": {"window": 4}}]},
    "mla": {"block": {"mixer": {"kind": "mla", "n_heads": 4, "kv_lora_rank": 12, "qk_rope_head_dim": 8,
                                    "qk_nope_head_dim": 4, "v_head_dim": 6, "q_lora_rank": 10}}},
    # DeepSeek Sparse Attention: the indexer's keys ride in the pages beside the rotary key; 3 keys per query.
    "mla-indexer": {"block": {"mixer": {"kind": "mla", "n_heads": 4, "kv_lora_rank": 12, "qk_rope_head_dim": 8,
                                            "qk_nope_head_dim": 4, "v_head_dim": 6, "q_lora_rank": 10,
                                            "indexer": {"kind": "lightning", "topk": 3, "n_heads": 4, "head_dim": 10}}}},
}


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_every_attention_layout_batches_to_its_results_alone(name) -> None:
    import specformer

    from .conftest import served_spec

    spec = served_spec()
    changes = ARCHITECTURES[name]
    for key, value in changes.items():
        if key == "block":
            spec["model"]["block"] = {**spec["model"]["block"], **value}
        else:
            spec["model"][key] = value
    model = specformer.build(spec, seed=3).eval()
    requests = _requests(6, seed=4, longest=20)
    engine = Engine(model, max_batch=6, num_blocks=64, block_size=4).start()
    try:
        collector = _run(engine, requests)
    finally:
        engine.stop()
    for i, r in enumerate(requests):
        assert collector.tokens[i] == _alone(model, r), f"{name}: request {i}"
    assert engine.largest_batch > 1 and engine.pool.free == engine.pool.num_blocks


def test_a_quantized_model_batches_to_its_results_alone() -> None:
    """Any model ``specformer.load`` gives can be served: here int8 weights (the quant plugin)."""
    import specformer
    from specformer_quant import quantize

    from .conftest import served_spec

    model = specformer.build(served_spec(), seed=5).eval()
    quantize(model, "int8")
    requests = _requests(5, seed=6, longest=16)
    engine = Engine(model, max_batch=5, num_blocks=64, block_size=4).start()
    try:
        collector = _run(engine, requests)
    finally:
        engine.stop()
    for i, r in enumerate(requests):
        assert collector.tokens[i] == _alone(model, r), f"request {i}"
