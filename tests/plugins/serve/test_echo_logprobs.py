"""``echo`` with ``logprobs`` on /v1/completions: the prompt scored by the prefill forward, in OpenAI's legacy form.

Every number is checked against the model's own full-sequence forward, log-softmax in
float32, written out here: position ``i``'s logits score token ``i + 1``; the first
token has no logprob.
"""

from __future__ import annotations

import threading
from typing import Any

import openai
import pytest
import torch

from specformer_generate import generate
from specformer_generate.samplers.pipeline import build_sampler
from specformer_serve import engine as engine_module
from specformer_serve.engine import EndEvent, Engine, PromptEvent, SequenceRequest, TokenEvent

from .conftest import BYTES, EOT, MODEL_ID


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def scored(model: Any, tokens: list[int]) -> torch.Tensor:
    """``(T, V)`` float32 log-probabilities of the next token at every position of ``tokens``."""
    with torch.inference_mode():
        return torch.log_softmax(model(torch.tensor([tokens]))[0].float(), dim=-1)


def by_text(row: torch.Tensor, k: int) -> dict[str, float]:
    """The ``k`` likeliest tokens keyed by their text; tokens that decode alike keep the likeliest."""
    values, ids = row.topk(k)
    keyed: dict[str, float] = {}
    for token, value in zip(ids.tolist(), values.tolist()):
        keyed.setdefault(BYTES.decode([token]), value)
    return keyed


def test_max_tokens_0_scores_the_prompt_alone(client, model, server) -> None:
    prompt = "The quick brown fox"
    ids = BYTES.encode(prompt)
    r = client.completions.create(model=MODEL_ID, prompt=prompt, echo=True, logprobs=3, max_tokens=0)
    choice = r.choices[0]
    assert choice.text == prompt and choice.finish_reason == "length"
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 0
    lp = choice.logprobs
    expected = scored(model, ids)
    assert lp.tokens == [BYTES.decode([t]) for t in ids]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.text_offset == list(range(len(ids)))
    for i in range(1, len(ids)):
        assert lp.token_logprobs[i] == pytest.approx(expected[i - 1, ids[i]].item(), abs=1e-4), i
        want = by_text(expected[i - 1], 3)
        assert lp.top_logprobs[i].keys() == want.keys()
        assert list(lp.top_logprobs[i].values()) == pytest.approx(list(want.values()), abs=1e-4)
    stats = server.engine.stats()
    assert stats["free_blocks"] == stats["total_blocks"] and stats["running"] == 0  # ended, its blocks back


def test_echo_with_tokens_continues_the_prompts_logprobs_with_the_generated_ones(client, model) -> None:
    """What lm_eval's local-completions sends: token-id prompts, echo, logprobs 1, max_tokens 1; and two more."""
    prompts = [BYTES.encode("Paris is the capital of"), BYTES.encode("ab"), [7, 250, 3, 9, 100]]
    r = client.completions.create(model=MODEL_ID, prompt=prompts, echo=True, logprobs=1, max_tokens=3, temperature=0,
                                  extra_body={"return_token_ids": True})
    assert [c.index for c in r.choices] == [0, 1, 2]
    for ids, choice in zip(prompts, r.choices):
        generated = choice.token_ids
        assert generated == generate(model, [ids], max_new_tokens=3, eos_token_id=EOT)[0][len(ids):]
        assert choice.text == BYTES.decode(ids) + BYTES.decode(generated)
        lp = choice.logprobs
        everything = ids + generated
        expected = scored(model, everything)
        assert len(lp.token_logprobs) == len(everything) and lp.token_logprobs[0] is None
        for i in range(1, len(everything)):
            assert lp.token_logprobs[i] == pytest.approx(expected[i - 1, everything[i]].item(), abs=1e-4), i
            # lm_eval's is_greedy: the token's logprob equals the best alternative's, exactly, when it is the argmax.
            top2 = expected[i - 1].topk(2).values
            if top2[0] - top2[1] > 1e-3:  # a near tie may go either way in a batched forward
                greedy = everything[i] == int(expected[i - 1].argmax())
                assert (lp.token_logprobs[i] == max(lp.top_logprobs[i].values())) == greedy, i
        assert all(lp.token_logprobs[len(ids) + j] == max(lp.top_logprobs[len(ids) + j].values()) for j in range(3))
        texts = [BYTES.decode([t]) for t in everything]
        assert lp.text_offset == [sum(map(len, texts[:i])) for i in range(len(texts))]


def test_echo_without_logprobs_is_the_prompt_then_the_text(client, model) -> None:
    r = client.completions.create(model=MODEL_ID, prompt="Echo me", echo=True, max_tokens=5, temperature=0, n=2)
    plain = client.completions.create(model=MODEL_ID, prompt="Echo me", max_tokens=5, temperature=0)
    assert [c.text for c in r.choices] == ["Echo me" + plain.choices[0].text] * 2
    assert all(c.logprobs is None for c in r.choices)


def test_a_prompt_filling_the_whole_context_can_be_scored(client, model) -> None:
    ids = [(37 * i) % 256 for i in range(96)]  # the model's context is 96
    r = client.completions.create(model=MODEL_ID, prompt=ids, echo=True, logprobs=0, max_tokens=0)
    lp = r.choices[0].logprobs
    expected = scored(model, ids)
    assert lp.token_logprobs[1:] == pytest.approx([expected[i - 1, ids[i]].item() for i in range(1, 96)], abs=1e-4)
    assert lp.top_logprobs[1:] == [{}] * 95  # logprobs 0: the chosen token's, no alternatives
    with pytest.raises(openai.BadRequestError, match="at least one must be left"):
        client.completions.create(model=MODEL_ID, prompt=ids, echo=True, logprobs=0, max_tokens=1)


def test_a_streamed_echo_sends_the_prompt_first(client) -> None:
    fields = dict(model=MODEL_ID, prompt="Stream echo", echo=True, logprobs=2, max_tokens=8, temperature=0.7, seed=3)
    whole = client.completions.create(**fields).choices[0]
    chunks = [c.choices[0] for c in client.completions.create(stream=True, **fields)]
    assert chunks[0].text == "Stream echo"
    assert chunks[0].logprobs.token_logprobs[0] is None and len(chunks[0].logprobs.tokens) == len("Stream echo")
    assert "".join(c.text for c in chunks) == whole.text
    streamed = [v for c in chunks if c.logprobs for v in c.logprobs.token_logprobs]
    assert streamed[1:] == pytest.approx(whole.logprobs.token_logprobs[1:], abs=1e-4)


def test_the_engine_scores_long_prompts_in_chunks_the_same(model, monkeypatch) -> None:
    """Scoring is chunked over positions to bound memory; a chunk size that splits the prompt changes nothing."""
    prompt = [(11 * i + 5) % 256 for i in range(40)]
    expected = scored(model, prompt)
    monkeypatch.setattr(engine_module, "PROMPT_SCORE_CHUNK", 7)
    events: list[Any] = []
    done = threading.Event()

    def emit(event: Any) -> None:
        events.append(event)
        if isinstance(event, EndEvent):
            done.set()

    engine = Engine(model, max_batch=2, num_blocks=16, block_size=8).start()
    try:
        engine.submit(SequenceRequest(prompt=prompt, max_new_tokens=2, sampler=build_sampler(None), emit=emit,
                                      prompt_logprobs=4))
        assert done.wait(60)
    finally:
        engine.stop()
    assert isinstance(events[0], PromptEvent) and [type(e) for e in events[1:]] == [TokenEvent, TokenEvent, EndEvent]
    tokens = events[0].tokens
    assert [t.token for t in tokens] == prompt and tokens[0] == TokenEvent(prompt[0])
    for i in range(1, len(prompt)):
        assert tokens[i].logprob == pytest.approx(expected[i - 1, prompt[i]].item(), abs=1e-4), i
        values, ids = expected[i - 1].topk(4)
        assert [t for t, _ in tokens[i].top] == ids.tolist()
        assert [v for _, v in tokens[i].top] == pytest.approx(values.tolist(), abs=1e-4)
