"""The official ``openai`` client against a server on localhost: every result equals ``generate`` on the same input."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest
import torch

from specformer_generate import generate

from .conftest import BYTES, EOT, MODEL_ID

#: What the OpenAI sampling fields mean, written out independently of the server's mapping:
#: penalties (frequency, then presence), then temperature, then top-p; temperature 0 is greedy.
SETTINGS: list[tuple[dict[str, Any], list[Any] | None]] = [
    ({"temperature": 0}, None),
    ({"temperature": 0.7, "top_p": 0.9, "seed": 11}, [{"kind": "temperature", "value": 0.7}, {"kind": "top_p", "p": 0.9}]),
    ({"temperature": 1.0, "seed": 12}, []),
    ({"temperature": 0.9, "frequency_penalty": 0.6, "presence_penalty": -0.4, "seed": 13},
     [{"kind": "frequency_penalty", "penalty": 0.6}, {"kind": "presence_penalty", "penalty": -0.4},
      {"kind": "temperature", "value": 0.9}]),
    ({"temperature": 0, "frequency_penalty": 1.5}, [{"kind": "frequency_penalty", "penalty": 1.5}, "greedy"]),
]


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def alone(model: Any, prompt: list[int], n: int, sampler: Any, seed: int | None) -> list[int]:
    out = generate(model, [prompt], max_new_tokens=n, sampler=sampler, seed=seed, eos_token_id=EOT)[0]
    return out[len(prompt):]


def test_models_lists_the_served_model(client) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL_ID]
    assert models[0].owned_by == "specformer"


@pytest.mark.parametrize("fields, sampler", SETTINGS)
def test_a_completion_equals_generate(client, model, fields, sampler) -> None:
    prompt = "The quick brown fox"
    r = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=24, extra_body={"return_token_ids": True},
                                  **fields)
    choice = r.choices[0]
    expected = alone(model, BYTES.encode(prompt), 24, sampler, fields.get("seed"))
    assert choice.token_ids == expected
    assert choice.prompt_token_ids == BYTES.encode(prompt)
    assert choice.text == BYTES.decode(expected)
    assert choice.finish_reason == ("stop" if expected[-1] == EOT else "length")
    assert r.usage.prompt_tokens == len(prompt) and r.usage.completion_tokens == len(expected)
    assert r.usage.total_tokens == len(prompt) + len(expected)


def test_a_prompt_of_token_ids_and_a_batch_of_prompts(client, model) -> None:
    prompts = [[72, 105, 33], [10, 20, 30, 40, 50]]
    r = client.completions.create(model=MODEL_ID, prompt=prompts, max_tokens=10, temperature=0,
                                  extra_body={"return_token_ids": True})
    assert [c.index for c in r.choices] == [0, 1]
    for prompt, choice in zip(prompts, r.choices):
        assert choice.token_ids == alone(model, prompt, 10, None, None)
    assert r.usage.prompt_tokens == 8


def test_chat_renders_the_messages_then_equals_generate(client, model) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    r = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=20, temperature=0.8, seed=4,
                                       extra_body={"return_token_ids": True})
    rendered = "system: Be brief.\nuser: Hello there\nassistant:"  # the built-in template, one line per message
    expected = alone(model, BYTES.encode(rendered), 20, [{"kind": "temperature", "value": 0.8}], 4)
    choice = r.choices[0]
    assert choice.token_ids == expected
    assert choice.message.role == "assistant" and choice.message.content == BYTES.decode(expected)
    assert r.usage.prompt_tokens == len(rendered)
    assert r.object == "chat.completion"


def test_streamed_completion_is_the_same_text_in_pieces(client) -> None:
    fields = dict(model=MODEL_ID, prompt="Once upon a time", max_tokens=30, temperature=0.8, seed=21)
    whole = client.completions.create(**fields)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **fields))
    pieces = [c.choices[0].text for c in chunks if c.choices]
    # How many chunks carry text depends on how fast the client reads (a client that falls behind gets several
    # tokens in one chunk), so only what every schedule gives is checked: the pieces make the whole text.
    assert "".join(pieces) == whole.choices[0].text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason and all(f is None for f in finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_a_stream_carries_each_new_tokens_ids_when_asked(client, model) -> None:
    prompt = "Stream ids"
    chunks = list(client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=20, temperature=0, stream=True,
                                            extra_body={"return_token_ids": True}))
    pieces = [getattr(c.choices[0], "token_ids", None) or [] for c in chunks]
    assert [t for piece in pieces for t in piece] == alone(model, BYTES.encode(prompt), 20, None, None)
    # A chunk per step (several tokens when the client fell behind, so their number depends on the load), whether
    # or not a token ends a character; only the closing chunk may carry none.
    assert all(pieces[:-1])


def test_streamed_chat_is_the_same_text_in_pieces(client) -> None:
    fields = dict(model=MODEL_ID, messages=[{"role": "user", "content": "Tell me"}], max_tokens=25, seed=2)
    whole = client.chat.completions.create(**fields)
    chunks = list(client.chat.completions.create(stream=True, **fields))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_a_stop_string_ends_the_text_just_before_it(client) -> None:
    base = dict(model=MODEL_ID, prompt="abcabc", max_tokens=40, temperature=0)
    full = client.completions.create(**base).choices[0].text
    printable = [i for i in range(4, len(full) - 2) if full[i:i + 2].isprintable() and "\ufffd" not in full[i:i + 2]]
    assert printable, f"no printable pair in {full!r}"
    stop = full[printable[0]:printable[0] + 2]
    cut = full[: full.find(stop)]
    r = client.completions.create(stop=[stop, "\x00never"], **base)
    assert r.choices[0].text == cut and r.choices[0].finish_reason == "stop"
    streamed = client.completions.create(stop=stop, stream=True, **base)
    assert "".join(c.choices[0].text for c in streamed) == cut


def test_n_choices_are_each_the_prompt_alone_with_seed_plus_index(client, model) -> None:
    prompt = "Numbers:"
    r = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=16, n=3, temperature=1.0, seed=100,
                                  extra_body={"return_token_ids": True})
    got = [c.token_ids for c in sorted(r.choices, key=lambda c: c.index)]
    assert got == [alone(model, BYTES.encode(prompt), 16, [], 100 + j) for j in range(3)]
    assert len({tuple(t) for t in got}) == 3
    assert r.usage.prompt_tokens == len(prompt) and r.usage.completion_tokens == sum(map(len, got))


def test_a_seed_makes_sampling_repeatable(client) -> None:
    fields = dict(model=MODEL_ID, prompt="Seeded", max_tokens=20, temperature=1.0)
    a = client.completions.create(seed=7, **fields).choices[0].text
    b = client.completions.create(seed=7, **fields).choices[0].text
    c = client.completions.create(seed=8, **fields).choices[0].text
    assert a == b and a != c


def test_logprobs_are_the_models_log_softmax(client, model) -> None:
    prompt = BYTES.encode("Log")
    r = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=6, temperature=0, logprobs=3,
                                  extra_body={"return_token_ids": True})
    choice = r.choices[0]
    lp = choice.logprobs
    with torch.inference_mode():
        for i, token in enumerate(choice.token_ids):
            log_softmax = torch.log_softmax(model(torch.tensor([prompt + choice.token_ids[:i]]))[0, -1].float(), -1)
            assert lp.token_logprobs[i] == pytest.approx(log_softmax[token].item(), abs=1e-4)
            assert lp.tokens[i] == BYTES.decode([token])
            assert len(lp.top_logprobs[i]) <= 3  # alternatives keyed by text: distinct bytes may share one
            assert max(lp.top_logprobs[i].values()) == pytest.approx(log_softmax.max().item(), abs=1e-4)
    chat = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "x"}], max_tokens=3,
                                          temperature=0, logprobs=True, top_logprobs=2)
    entries = chat.choices[0].logprobs.content
    assert len(entries) == 3 and all(len(e.top_logprobs) == 2 for e in entries)
    assert all(e.logprob == pytest.approx(e.top_logprobs[0].logprob) for e in entries)  # greedy: the likeliest


def test_sixteen_concurrent_clients_get_their_sequential_results(client, model, server) -> None:
    rng = random.Random(5)
    jobs = [([rng.randrange(256) for _ in range(rng.randrange(1, 40))], rng.randrange(1, 40), i) for i in range(16)]
    before = server.engine.stats()["decode_steps"]

    def ask(job: tuple[list[int], int, int]) -> list[int]:
        prompt, n, i = job
        fields: dict[str, Any] = {"temperature": 0} if i % 2 else {"temperature": 0.9, "seed": i}
        r = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=n,
                                      extra_body={"return_token_ids": True}, **fields)
        return r.choices[0].token_ids

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(ask, jobs))
    for (prompt, n, i), got in zip(jobs, results):
        sampler = None if i % 2 else [{"kind": "temperature", "value": 0.9}]
        assert got == alone(model, prompt, n, sampler, None if i % 2 else i), f"request {i}"
    stats = server.engine.stats()
    longest = max(len(r) for r in results)
    # Sequential decoding would take about sum(len) - 16 steps; batched, far fewer.
    assert stats["decode_steps"] - before < sum(map(len, results)) - 16 and stats["largest_batch"] > 1, (stats, longest)
    assert stats["free_blocks"] == stats["total_blocks"]
