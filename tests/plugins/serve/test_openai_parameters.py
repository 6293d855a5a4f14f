"""What third-party OpenAI clients send by default is taken: ``models.retrieve``, ``response_format`` text,
``logit_bias``, ``tools: []``, the ignored fields, an assistant message with ``content: null``."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
import torch

from specformer_generate import generate

from .conftest import BYTES, EOT, MODEL_ID, make_server

CHAT = dict(model=MODEL_ID, messages=[{"role": "user", "content": "Hello there"}], max_tokens=12, temperature=0)


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def next_logits(model: Any, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([tokens]))[0, -1].float()


def test_models_retrieve_gives_the_served_model_and_404_for_another(client, server) -> None:
    found = client.models.retrieve(MODEL_ID)
    assert (found.id, found.object, found.owned_by) == (MODEL_ID, "model", "specformer")
    assert found.model_dump() == client.models.list().data[0].model_dump()
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("gpt-4o")
    assert caught.value.body["code"] == "model_not_found" and caught.value.body["param"] == "model"


def test_a_model_id_with_a_slash_is_retrieved(model) -> None:
    with make_server(model, config={"model_id": "org/tiny-v1"}) as served:
        assert httpx.get(f"{served.url}/v1/models/org/tiny-v1").json()["id"] == "org/tiny-v1"
        assert httpx.get(f"{served.url}/v1/models/org").status_code == 404


def test_models_retrieve_needs_the_api_key(model) -> None:
    with make_server(model, api_key="s3cret") as served:
        r = httpx.get(f"{served.url}/v1/models/{MODEL_ID}")
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        good = {"Authorization": "Bearer s3cret"}
        assert httpx.get(f"{served.url}/v1/models/{MODEL_ID}", headers=good).json()["id"] == MODEL_ID


def test_fields_that_ask_for_nothing_else_change_nothing(client) -> None:
    """OpenAI's defaults as litellm and langchain send them, and fields with no meaning for a local model."""
    plain = client.chat.completions.create(**CHAT).choices[0].message.content
    extras: list[dict[str, Any]] = [
        {"response_format": {"type": "text"}},
        {"tools": [], "tool_choice": "none", "parallel_tool_calls": False},
        {"tool_choice": "auto"},
        {"logit_bias": {}},
        {"reasoning_effort": "low", "store": False, "metadata": {"k": "v"}, "user": "u1", "service_tier": "auto",
         "prompt_cache_key": "k", "safety_identifier": "s"},
    ]
    for fields in extras:
        r = client.chat.completions.create(**CHAT, **fields)
        assert r.choices[0].message.content == plain, fields
    completion = dict(model=MODEL_ID, prompt="Hello", max_tokens=8, temperature=0)
    assert (client.completions.create(**completion, logit_bias={}, user="u").choices[0].text
            == client.completions.create(**completion).choices[0].text)


def test_an_assistant_message_with_null_content_is_an_empty_turn(client) -> None:
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": None}, {"role": "user", "content": "Hm"}]
    empty = [*turns[:1], {"role": "assistant", "content": ""}, *turns[2:]]
    got = client.chat.completions.create(**{**CHAT, "messages": turns}, extra_body={"return_token_ids": True})
    want = client.chat.completions.create(**{**CHAT, "messages": empty}, extra_body={"return_token_ids": True})
    assert got.choices[0].prompt_token_ids == want.choices[0].prompt_token_ids
    assert got.choices[0].prompt_token_ids == BYTES.encode("user: Hi\nassistant: \nuser: Hm\nassistant:")
    assert got.choices[0].message.content == want.choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="only an assistant message may have content null"):
        client.chat.completions.create(**{**CHAT, "messages": [{"role": "user", "content": None}]})


def test_a_bias_of_plus_100_forces_a_token_and_minus_100_forbids_it(client, model) -> None:
    prompt = BYTES.encode("Bias")
    forced = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=10, temperature=1.0, seed=5,
                                       logit_bias={str(ord("Q")): 100}, extra_body={"return_token_ids": True})
    assert forced.choices[0].token_ids == [ord("Q")] * 10
    greedy = generate(model, [prompt], max_new_tokens=10, eos_token_id=EOT)[0][len(prompt):]
    banned = greedy[0]
    r = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=10, temperature=0,
                                  logit_bias={str(banned): -100}, extra_body={"return_token_ids": True})
    tokens = r.choices[0].token_ids
    assert banned not in tokens
    # Greedy over the biased logits: the first token is the model's best after the banned one.
    logits = next_logits(model, prompt)
    logits[banned] -= 100
    assert tokens[0] == int(logits.argmax())


def test_a_bias_shifts_the_logit_by_its_value(client, model) -> None:
    """Greedy decoding takes ``argmax(logits + bias)``: a bias just over the gap makes the runner-up win."""
    prompt = BYTES.encode("Shift")
    logits = next_logits(model, prompt)
    top = logits.topk(2)
    best, second = top.indices.tolist()
    gap = float(top.values[0] - top.values[1])
    r = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=1, temperature=0,
                                  logit_bias={str(second): gap + 0.05}, extra_body={"return_token_ids": True})
    assert r.choices[0].token_ids == [second]
    r = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=1, temperature=0,
                                  logit_bias={str(second): max(gap - 0.05, 0.0)}, extra_body={"return_token_ids": True})
    assert r.choices[0].token_ids == [best]


def test_a_bias_applies_to_chat_too(client) -> None:
    r = client.chat.completions.create(**CHAT, logit_bias={str(ord("z")): 100})
    assert r.choices[0].message.content == "z" * 12


def test_tools_are_refused_with_what_is_supported(client) -> None:
    """(response_format is served: test_response_format.py.)"""
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(**CHAT, tools=[tool])
    assert (caught.value.body["param"], caught.value.body["code"]) == ("tools", "unsupported_value")
