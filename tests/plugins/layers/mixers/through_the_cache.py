"""What every recurrent mixer must do inside a model, written once: test_through_the_cache.py runs each on each mixer.

Each takes a built model (vocabulary of at least 97 tokens) whose mixer keeps a recurrent state,
alone or beside attention layers, and compares what the cache gives against the plain forward.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

import specformer
from specformer_generate import StaticKVCache

from tests.fixtures.tiny import tiny_spec


def tiny_mixer_model(mixer: dict, *, mixed: bool = False,
                     perturb: Callable[[str, torch.Tensor], torch.Tensor | None] | None = None):
    """Three tiny layers of ``mixer`` (``mixed``: the middle one attention, with RoPE), in eval mode.

    ``perturb(name, parameter)`` may return a new value for a parameter, to move gates and decays away
    from their initial values where those would hide a mistake.
    """
    spec = tiny_spec(block={"mixer": mixer}, positional={"kind": "none"}, n_layers=3)
    if mixed:
        spec["model"]["positional"] = {"kind": "rope"}
        spec["model"]["layers"] = [{"select": "1", "mixer": {"kind": "attention", "n_heads": 4, "n_kv_heads": 2}}]
    model = specformer.build(spec, seed=0).eval()
    if perturb is not None:
        with torch.no_grad():
            for name, p in model.named_parameters():
                value = perturb(name, p)
                if value is not None:
                    p.copy_(value)
    return model


def decode(model, tokens: torch.Tensor, *, prefill: int, steps: bool = False) -> torch.Tensor:
    """``tokens`` ``(B, T)`` through the cache: ``prefill`` at once, then one token a step (``steps``: keep every step)."""
    batch, length = tokens.shape
    cache = StaticKVCache.for_model(model, batch_size=batch, capacity=length, spare=length)
    cache.keep_steps = steps
    positions = torch.arange(length).expand(batch, length)
    outs = [model(tokens[:, :prefill], positions=positions[:, :prefill], cache=cache)]
    for t in range(prefill, length):
        outs.append(model(tokens[:, t:t + 1], positions=positions[:, t:t + 1], cache=cache))
    return torch.cat(outs, 1)


def assert_cached_decode_equals_the_uncached_forward(model) -> None:
    tokens = torch.randint(0, 97, (2, 11))
    with torch.no_grad():
        want = model(tokens)
        torch.testing.assert_close(decode(model, tokens, prefill=6), want, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(decode(model, tokens, prefill=1, steps=True), want, rtol=1e-4, atol=1e-5)


def assert_a_left_padded_ragged_batch_equals_each_row_alone(model) -> None:
    """Through the cache and recomputed without one: padding never enters a state."""
    rows = [torch.randint(1, 97, (n,)) for n in (9, 4, 6)]
    longest, extra = 9, 3
    tokens = torch.zeros(3, longest, dtype=torch.long)
    positions = torch.full((3, longest), -1)
    for i, row in enumerate(rows):
        tokens[i, longest - len(row):] = row
        positions[i, longest - len(row):] = torch.arange(len(row))
    follow = torch.randint(1, 97, (3, extra))
    with torch.no_grad():
        cache = StaticKVCache.for_model(model, batch_size=3, capacity=longest + extra)
        got = [model(tokens, positions=positions, cache=cache)]
        for t in range(extra):
            start = torch.tensor([len(r) + t for r in rows])[:, None]
            got.append(model(follow[:, t:t + 1], positions=start, cache=cache))
        got = torch.cat(got, 1)
        recomputed = model(torch.cat((tokens, follow), 1),
                           positions=torch.cat((positions, torch.tensor([[len(r) + t for t in range(extra)] for r in rows])), 1))
        for i, row in enumerate(rows):
            want = model(torch.cat((row, follow[i]))[None])[0]
            torch.testing.assert_close(got[i, longest - len(row):], want, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(recomputed[i, longest - len(row):], want, rtol=1e-4, atol=1e-5)


def assert_packed_documents_equal_each_document_alone(model) -> None:
    tokens = torch.randint(0, 97, (2, 10))
    documents = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 2, 2, 2], [5, 5, 5, 5, 5, 5, 7, 7, 7, 7]])
    with torch.no_grad():
        got = model(tokens, document_ids=documents)
        for row, cuts in ((0, [(0, 3), (3, 7), (7, 10)]), (1, [(0, 6), (6, 10)])):
            for a, b in cuts:
                torch.testing.assert_close(got[row, a:b], model(tokens[row:row + 1, a:b])[0], rtol=1e-4, atol=1e-5)


def assert_reorder_and_rollback_restore_the_states_exactly(model) -> None:
    tokens = torch.randint(0, 97, (2, 9))
    positions = torch.arange(9).expand(2, 9)
    with torch.no_grad():
        cache = StaticKVCache.for_model(model, batch_size=2, capacity=9, spare=4)
        model(tokens[:, :4], positions=positions[:, :4], cache=cache)
        cache.keep_steps = True
        model(tokens[:, 4:8], positions=positions[:, 4:8], cache=cache)  # four drafts, two kept
        cache.rollback(6)
        got = model(tokens[:, 6:7], positions=positions[:, 6:7], cache=cache)
        torch.testing.assert_close(got, model(tokens[:, :7])[:, 6:], rtol=1e-4, atol=1e-5)

        cache = StaticKVCache.for_model(model, batch_size=2, capacity=9)
        model(tokens[:, :5], positions=positions[:, :5], cache=cache)
        cache.reorder(torch.tensor([1, 1]))
        got = model(tokens[1:2, 5:6].expand(2, 1), positions=positions[:, 5:6], cache=cache)
        want = model(tokens[1:2, :6])[:, 5:]
        torch.testing.assert_close(got, want.expand(2, -1, -1), rtol=1e-4, atol=1e-5)


def assert_served_requests_batched_give_what_each_gives_alone(model) -> None:
    """The serve engine's paged cache keeps one state per request: more requests than the batch holds."""
    from tests.plugins.serve.test_engine import assert_greedy_batched_equals_alone

    prompts = [[5, 9, 2, 7, 1], [3], [8, 8, 1, 4, 4, 6, 2], [11, 12]]
    assert_greedy_batched_equals_alone(model, prompts, [4, 6, 3, 5], max_batch=2, num_blocks=32)
