"""``response_format`` through the openai client: the generated text is JSON the schema accepts, streamed or not.

On the tiny random byte-level model, which never writes JSON by chance: the constraint does all
of it. Each answer is parsed with ``json.loads`` and checked with ``jsonschema.validate`` (not
with the engine that constrained it), and its tokens equal ``generate`` with the same
``json_schema`` sampler on that prompt alone, also when served beside unconstrained requests.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest

from specformer_generate import generate

from .conftest import BYTES, EOT, MODEL_ID, make_server

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

RENDERED = "user: Who is it?\nassistant:"  # the built-in template's rendering of MESSAGES
MESSAGES = [{"role": "user", "content": "Who is it?"}]
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "pattern": "^[a-z]{1,6}$"}, "age": {"type": "integer", "minimum": 0,
                                                                                   "maximum": 120},
                   "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
#: Sampling settings and the sampler list they mean after the constraint (as test_openai_client writes them out).
SETTINGS: list[tuple[dict[str, Any], list[Any]]] = [
    ({"temperature": 0}, ["greedy"]),
    ({"temperature": 0.9, "top_p": 0.95, "seed": 3}, [{"kind": "temperature", "value": 0.9}, {"kind": "top_p", "p": 0.95}]),
    ({"temperature": 1.0, "seed": 4}, []),
]


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def alone(model: Any, prompt: list[int], n: int, sampler: list[Any], seed: int | None) -> list[int]:
    out = generate(model, [prompt], max_new_tokens=n, sampler=sampler, seed=seed, eos_token_id=EOT, tokenizer=BYTES)[0]
    return out[len(prompt):]


def _valid(text: str, schema: dict[str, Any]) -> Any:
    value = json.loads(text)
    jsonschema.validate(value, schema)
    return value


@pytest.mark.parametrize("fields, rest", SETTINGS)
def test_a_json_schema_answer_validates_and_equals_generate(client, model, fields, rest) -> None:
    r = client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=60, response_format=SCHEMA_FORMAT,
                                       extra_body={"return_token_ids": True}, **fields)
    choice = r.choices[0]
    _valid(choice.message.content, SCHEMA)
    assert choice.finish_reason == "stop" and choice.token_ids[-1] == EOT
    expected = alone(model, BYTES.encode(RENDERED), 60, [{"kind": "json_schema", "schema": SCHEMA}, *rest],
                     fields.get("seed"))
    assert choice.token_ids == expected


def test_json_object_gives_a_json_object(client) -> None:
    for seed in range(3):
        r = client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, temperature=1.0, seed=seed,
                                           response_format={"type": "json_object"})
        assert isinstance(json.loads(r.choices[0].message.content), dict), r.choices[0].message.content


def test_text_is_no_constraint(client) -> None:
    plain = client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=12, temperature=0)
    text = client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=12, temperature=0,
                                          response_format={"type": "text"})
    assert text.choices[0].message.content == plain.choices[0].message.content


def test_streamed_chunks_join_into_valid_json(client) -> None:
    for seed in (5, 6):
        stream = client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=60, temperature=1.0,
                                                seed=seed, response_format=SCHEMA_FORMAT, stream=True)
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        _valid(text, SCHEMA)
        assert chunks[-1].choices[0].finish_reason == "stop"
        whole = client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=60, temperature=1.0,
                                               seed=seed, response_format=SCHEMA_FORMAT)
        assert whole.choices[0].message.content == text


def test_completions_take_it_too_as_an_extension(client, model) -> None:
    prompt = "Person: "
    r = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=60, temperature=0, n=1,
                                  extra_body={"response_format": SCHEMA_FORMAT, "return_token_ids": True})
    _valid(r.choices[0].text, SCHEMA)
    assert r.choices[0].token_ids == alone(model, BYTES.encode(prompt), 60,
                                           [{"kind": "json_schema", "schema": SCHEMA}, "greedy"], None)


def test_n_choices_each_validate(client) -> None:
    r = client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=60, temperature=1.0, seed=9, n=3,
                                       response_format=SCHEMA_FORMAT)
    texts = [c.message.content for c in r.choices]
    for text in texts:
        _valid(text, SCHEMA)
    assert len(set(texts)) > 1


BAD = [
    ({"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "frob"}}},
     "response_format.json_schema.schema", "frob"),
    ({"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "string", "pattern": "[a-"}}},
     "response_format.json_schema.schema", "unclosed character class"),
    ({"type": "json_schema", "json_schema": {"name": "p"}}, "response_format.json_schema.schema", "Field required"),
    ({"type": "json_schema"}, "response_format", "needs the field json_schema"),
    ({"type": "json_object", "json_schema": {"name": "p", "schema": {}}}, "response_format", "only with type"),
    ({"type": "json_schema", "json_schema": {"name": "p", "schema": "/etc/passwd"}},
     "response_format.json_schema.schema", "valid dictionary"),
    ({"type": "yaml"}, "response_format.type", "Input should be"),
]


@pytest.mark.parametrize("response_format, param, says", BAD)
def test_a_bad_format_is_a_400_naming_it_and_the_server_goes_on(client, response_format, param, says) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=20,
                                       response_format=response_format)
    error = caught.value.body
    assert error["param"] == param and says in error["message"], error
    assert error["message"].startswith(param.split(".")[0]) or error["param"] == param
    good = client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=60, temperature=0,
                                          response_format=SCHEMA_FORMAT)
    _valid(good.choices[0].message.content, SCHEMA)


def test_a_server_without_an_end_of_sequence_id_refuses_it(model) -> None:
    with make_server(model, eos=False) as served:
        client = openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=20,
                                           response_format={"type": "json_object"})
        assert caught.value.body["param"] == "response_format"
        assert "end-of-sequence" in caught.value.body["message"]


def test_constrained_beside_unconstrained_each_get_what_they_get_alone(client, model, server) -> None:
    before = server.engine.stats()["decode_steps"]
    prompts = [f"Row {i}: " for i in range(8)]

    def ask(i: int) -> list[int]:
        extra: dict[str, Any] = {"return_token_ids": True}
        if i % 2 == 0:
            extra["response_format"] = SCHEMA_FORMAT
        r = client.completions.create(model=MODEL_ID, prompt=prompts[i], max_tokens=50, temperature=0.9, seed=20 + i,
                                      extra_body=extra)
        return r.choices[0].token_ids

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(ask, range(8)))
    for i, got in enumerate(results):
        constraint = [{"kind": "json_schema", "schema": SCHEMA}] if i % 2 == 0 else []
        assert got == alone(model, BYTES.encode(prompts[i]), 50, [*constraint, {"kind": "temperature", "value": 0.9}],
                            20 + i), f"request {i}"
        if i % 2 == 0:
            _valid(BYTES.decode(got[:-1]), SCHEMA)
    stats = server.engine.stats()
    assert stats["decode_steps"] - before < sum(map(len, results)) - 8 and stats["largest_batch"] > 1, stats
    assert stats["free_blocks"] == stats["total_blocks"]
