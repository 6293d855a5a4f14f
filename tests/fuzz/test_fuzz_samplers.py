"""Property-based: any sampler list builds a sampler that only ever picks allowed tokens, or is one clear error.

A case is a list of sampler entries: registered names and made-up ones, bare or as
``{kind: ..., **params}`` with each sampler's real parameters and made-up ones, given
any value (negative, zero, huge, infinite, NaN, booleans, strings, lists). It is tried
three ways: through the Python API (``build_sampler`` then ``generate``), as the
``--sampler`` value inline (YAML or JSON, sometimes spliced with YAML tags, aliases or
an alias bomb) and as a ``--sampler`` file, and through ``specformer generate``.

Invariants (besides ``harness``'s): a sampler that builds only ever returns a token
that its own processed logits leave possible (a filtered token stays filtered whatever
follows: ``[top_k, temperature: .inf]`` used to emit filtered tokens), so with
``top_k: 3`` first, every token is one of the three likeliest; ``generate`` returns
ids inside the vocabulary; the three routes agree on whether the list is valid.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from hypothesis import event, example, given
from hypothesis import strategies as st

import specformer
from specformer.errors import UserError
from specformer.registry.discovery import get_registry
from specformer.tokenizers.tokenizer import METADATA_KEY as TOKENIZER_KEY
from specformer.tokenizers.tokenizer import ByteTokenizer
from specformer_generate.generate_command import parse_sampler_option
from specformer_generate.generation import generate
from specformer_generate.samplers.pipeline import Sampler, build_sampler

from conftest import TINY
from fuzz.harness import FAST, PREFIX, SLOW, case_dir, expect_user_error, outcome, run_cli, sentinel

SAMPLERS = {c.name: sorted(c.params.model_fields) for c in get_registry() if c.kind == "sampler"}
CONSTRAINTS = {c.name for c in get_registry() if c.kind == "sampler" and getattr(c.params, "CONSTRAINT", False)}
VOCAB = TINY["model"]["vocab_size"]

numbers = st.one_of(st.integers(-3, 50), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
                    st.floats(0, 1), st.sampled_from([0, 1, 1e-300, 1e308, 0.5, 2**53 + 1]))
# Plausible values first (hypothesis draws the first alternatives most), so that many lists build and reach the
# checks on the tokens chosen; then anything.
param_values = st.one_of(st.integers(1, 50), st.floats(0.01, 1.0), numbers, st.booleans(), st.none(), st.text(max_size=6),
                         st.lists(numbers, max_size=2))


@st.composite
def entries(draw: Any) -> Any:
    name = draw(st.one_of(st.sampled_from(sorted(SAMPLERS)), st.sampled_from(sorted(SAMPLERS)), st.text(max_size=8)))
    form = draw(st.integers(0, 9))  # hypothesis draws small numbers most: a mapping is the usual case
    if form == 8:
        return name  # bare name
    if form == 9:
        return draw(st.one_of(numbers, st.none(), st.lists(st.text(max_size=3), max_size=2)))  # not an entry at all
    entry: dict[str, Any] = {"kind": name}
    for key in SAMPLERS.get(name, []):  # every real parameter, usually
        if draw(st.integers(0, 5)) < 5:
            entry[key] = draw(param_values)
    if draw(st.integers(0, 5)) == 5:
        entry[draw(st.sampled_from(["kind", "value", "k", "p", "zz"]))] = draw(param_values)
    return entry


#: Values each built-in sampler accepts (from its Params' bounds), edges included: lists of these build, so that the
#: checks on the chosen tokens see many pipelines (the arbitrary entries above mostly test the error path).
VALID = {
    "greedy": {},
    "top_k": {"k": st.integers(1, 120), "min_tokens_to_keep": st.integers(1, 5)},
    "top_p": {"p": st.floats(1e-9, 1.0), "min_tokens_to_keep": st.integers(1, 5)},
    "min_p": {"p": st.floats(0.0, 1.0), "min_tokens_to_keep": st.integers(1, 5)},
    "typical": {"p": st.floats(1e-9, 1.0, exclude_max=True), "min_tokens_to_keep": st.integers(1, 5)},
    "temperature": {"value": st.one_of(st.floats(1e-3, 1e3), st.sampled_from([1e-300, 5e-324, 1e300, 1.7e308]))},
    "repetition_penalty": {"penalty": st.one_of(st.floats(1e-3, 10.0), st.sampled_from([1e-300, 1e300]))},
    "frequency_penalty": {"penalty": st.floats(-2.0, 2.0)},
    "presence_penalty": {"penalty": st.floats(-2.0, 2.0)},
    "no_repeat_ngram": {"n": st.integers(1, 6)},
}


@st.composite
def valid_entries(draw: Any) -> dict[str, Any]:
    name = draw(st.sampled_from(sorted(set(VALID) - {"greedy"})))
    return {"kind": name, **{key: draw(values) for key, values in VALID[name].items() if draw(st.integers(0, 3)) < 3
                             or key != "min_tokens_to_keep"}}


@st.composite
def valid_lists(draw: Any) -> list[Any]:
    steps = draw(st.lists(valid_entries(), max_size=4))
    return steps + (["greedy"] if draw(st.integers(0, 3)) == 3 else [])


sampler_lists = st.one_of(valid_lists(), st.lists(entries(), max_size=4))


def inline_text(data: Any, form: int) -> str:
    if form == 0:
        return json.dumps(data)
    if form == 1:
        return yaml.safe_dump(data, default_flow_style=True).strip()
    if form == 2:
        return "&a " + yaml.safe_dump(data, default_flow_style=True).strip() + "\n"  # an anchor on the whole list
    if form == 3:
        return "!!python/object/apply:os.system ['touch fz-pwned']"
    if form == 4:
        lines = ["a0: &a0 [top_k, top_k]"] + [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]" for i in range(1, 12)]
        return "{" + ", ".join(lines) + ", sampler: *a11}"
    return yaml.safe_dump({"generate": {"sampler": data}}, default_flow_style=True).strip()


@pytest.fixture(scope="module")
def outside(tmp_path_factory):
    """The sentinel folder holds the tiny checkpoint every case generates from (it must never change)."""
    folder = sentinel(tmp_path_factory, "samplers")
    # A byte tokenizer stored with it: the prompts are text, and this vocabulary is not the byte tokenizer's own.
    specformer.save(specformer.build(TINY, seed=0), folder / f"{PREFIX}tiny.safetensors",
                    metadata={TOKENIZER_KEY: ByteTokenizer().to_json()})
    return folder


@pytest.fixture(scope="module")
def model(outside):
    return specformer.load(outside / f"{PREFIX}tiny.safetensors").eval()


def _check_choices(sampler: Sampler, seed: int) -> None:
    """The drawn token is one the processed logits leave possible; after top_k 3, one of the three likeliest."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, VOCAB, generator=generator) * 4
    ids = torch.randint(0, VOCAB, (3, 6), generator=generator)
    processed = sampler.process(logits, ids)
    token = sampler.choose(processed, generator)
    assert token.shape == (3,) and bool(((token >= 0) & (token < VOCAB)).all())
    for row in range(3):
        if not torch.isneginf(processed[row]).all():
            assert not torch.isneginf(processed[row, token[row]]), f"{sampler!r} chose a filtered token"
    topped = build_sampler([{"kind": "top_k", "k": 3}, *sampler.steps])
    processed = topped.process(logits, ids)
    token = topped.choose(processed, generator)
    for row in range(3):
        if not torch.isneginf(processed[row]).all():
            assert int(token[row]) in logits[row].topk(3).indices.tolist(), f"{topped!r} chose outside the top 3"


def _case(outside: Path, model: Any, data: Any, form: int, seed: int) -> None:
    with case_dir(outside) as case:
        built = expect_user_error(lambda: build_sampler(data))
        event(f"build_sampler: {outcome(built)}")
        if isinstance(built, Sampler):
            expect_user_error(lambda: _check_choices(built, seed))
            out = expect_user_error(lambda: generate(model, [[1, 2, 3]], max_new_tokens=3, sampler=built, seed=seed))
            if not isinstance(out, Exception):
                assert all(0 <= t < VOCAB for t in out[0]) and len(out[0]) <= 6
        text = inline_text(data, form)
        inline = expect_user_error(lambda: parse_sampler_option(text))
        file = case.work / f"{PREFIX}sampler.{'json' if form == 0 else 'yaml'}"
        file.write_text(text, encoding="utf-8")
        from_file = expect_user_error(lambda: parse_sampler_option(str(file)))
        if form in (0, 1, 2, 5):  # the same list three ways: valid in all or none
            assert isinstance(inline, Sampler) == isinstance(from_file, Sampler)
            if isinstance(data, list):
                assert isinstance(built, Sampler) == isinstance(inline, Sampler), (built, inline)
        else:
            assert isinstance(inline, UserError) and isinstance(from_file, UserError)
        event(f"inline --sampler: {outcome(inline)}")
        # The byte tokenizer's "AB" is ids 65 and 66, inside the tiny model's 97.
        cli = run_cli(["generate", str(outside / f"{PREFIX}tiny.safetensors"), "--prompt", "AB", "--max-new-tokens", "2",
                       "--seed", str(seed), "--sampler", text])
        event(f"generate --sampler: exit {cli.code}")
        if isinstance(inline, Sampler):
            assert cli.code == 0, cli.err


@FAST
@given(data=sampler_lists, form=st.integers(0, 5), seed=st.integers(0, 2**31))
@example(data=[{"kind": "top_k", "k": 3}, {"kind": "temperature", "value": float("inf")}], form=0, seed=0)
@example(data=[{"kind": "top_k", "k": 3}, {"kind": "temperature", "value": 1e-300}], form=1, seed=0)
@example(data=[{"kind": "top_p", "p": 0.0}, "greedy"], form=1, seed=0)
@example(data=["greedy", "top_k"], form=1, seed=0)  # greedy must be last
@example(data=[], form=4, seed=0)  # an alias bomb
def test_any_sampler_list(outside, model, data, form, seed):
    _case(outside, model, data, form, seed)


@pytest.mark.slow
@SLOW
@given(data=sampler_lists, form=st.integers(0, 5), seed=st.integers(0, 2**31))
def test_any_sampler_list_many(outside, model, data, form, seed):
    _case(outside, model, data, form, seed)


def test_the_valid_values_cover_every_registered_sampler_and_parameter():
    """A sampler added without valid values here would only ever be fuzzed on its error path."""
    # The constraint samplers (regex, choice, json_schema, grammar) run only once generate() binds them to a
    # tokenizer, which these pipelines over bare logits have not: tests/plugins/generate/test_gen_structured.py
    # tests their bad input and their outputs.
    assert {name: sorted(fields) for name, fields in VALID.items()} == {
        name: fields for name, fields in SAMPLERS.items() if name not in CONSTRAINTS}


def test_a_value_sharing_its_parts_is_quoted_without_walking_it():
    """A mapping holding 2**40 items by reference (a few kB in memory): refused at once, not printed in full."""
    from fuzz.harness import bounded
    from specformer.errors import SpecError

    value: Any = [1]
    for _ in range(40):
        value = [value, value]
    with bounded(30), pytest.raises(SpecError, match="expected a list of sampler components, got dict"):
        build_sampler({"kind": "top_k", "k": value})
