"""Constraint samplers (regex, choice, json_schema, grammar): every output is accepted by its constraint.

On a tiny random model, so the model itself never writes the format by chance: the mask does
all of it. Checked with independent parsers (``re.fullmatch``, ``json.loads`` and
``jsonschema.validate``, Lark's grammar re-checked by llguidance on the output text), with the
byte tokenizer and a small trained BPE, greedy and seeded sampling, ragged batches, beam
search and a speculative draft.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import specformer
from specformer.cli.main import main
from specformer.tokenizers.byte_file import byte_tokenizer_json
from specformer.tokenizers.tokenizer import BPETokenizer, ByteTokenizer, NoTokenizer
from specformer_generate import generate

from .specs_for_tests import tiny_with

llguidance = pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

BYTES = ByteTokenizer()
PROMPTS = ["Answer: ", "x", "The date of the event, in the calendar, is "]

DATE = r"[0-9]{4}-(0[1-9]|1[0-2])-[0-3][0-9]"
OPTIONS = ["yes", "no", "maybe, \"quoted\"", "ünïcode"]
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "pattern": "^[a-z]{1,6}$"}, "age": {"type": "integer", "minimum": 0, "maximum": 99},
                   "ok": {"type": "boolean"}},
    "required": ["name", "age", "ok"],
    "additionalProperties": False,
}
LARK = 'start: expr\nexpr: NUM | "(" expr OP expr ")"\nOP: "+" | "*"\nNUM: /[0-9]{1,3}/\n'


def _bpe() -> BPETokenizer:
    tokenizers = pytest.importorskip("tokenizers")
    inner = tokenizers.Tokenizer(tokenizers.models.BPE())
    inner.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    inner.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>"],
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    text = ['{"name": "ann", "age": 31, "ok": true} the quick brown fox 2024-05-17 (12+7)*3 yes no maybe'] * 50
    inner.train_from_iterator(text, trainer=trainer)
    return BPETokenizer(inner)


@pytest.fixture(scope="module", params=["byte", "bpe"])
def setup(request):
    tokenizer = BYTES if request.param == "byte" else _bpe()
    # A vocabulary wider than the tokenizer's (padded embeddings): ids past it must never be allowed.
    model = specformer.build(tiny_with(vocab_size=tokenizer.vocab_size + 5, context_length=128), seed=0).eval()
    return model, tokenizer


def _grammar_accepts(lark: str, text: str) -> bool:
    """llguidance's own matcher fed the output's bytes one by one (not the tokens that produced it)."""
    tok = llguidance.LLTokenizer(json.dumps(byte_tokenizer_json()), eos_token=256)
    matcher = llguidance.LLMatcher(tok, llguidance.LLMatcher.grammar_from_lark(lark), log_level=0)
    return matcher.consume_tokens(list(text.encode())) and matcher.is_accepting()


def _parse_expr(text: str) -> bool:
    """The LARK grammar written out as a recursive-descent check."""
    def expr(i: int) -> int:
        if i < len(text) and text[i] == "(":
            i = expr(i + 1)
            if i >= len(text) or text[i] not in "+*":
                return -1
            i = expr(i + 1)
            return i + 1 if 0 <= i < len(text) and text[i] == ")" else -1
        m = re.match(r"[0-9]{1,3}", text[i:])
        return i + m.end() if m else -1
    try:
        return expr(0) == len(text)
    except RecursionError:
        return False


CASES = {
    "regex": ([{"kind": "regex", "pattern": DATE}], lambda s: re.fullmatch(DATE, s) is not None),
    "choice": ([{"kind": "choice", "options": OPTIONS}], lambda s: s in OPTIONS),
    "json_schema": ([{"kind": "json_schema", "schema": SCHEMA}],
                    lambda s: jsonschema.validate(json.loads(s), SCHEMA) is None),
    "grammar": ([{"kind": "grammar", "lark": LARK}], _parse_expr),
}


def _outputs(model, tokenizer, prompts, sampler, **kwargs) -> list[str]:
    ids = [tokenizer.encode(p) for p in prompts]
    out = generate(model, ids, max_new_tokens=64, sampler=sampler, tokenizer=tokenizer,
                   eos_token_id=tokenizer.eot_id, **kwargs)
    texts = []
    for prompt, row in zip(ids, out):
        new = row[len(prompt):]
        assert new and new[-1] == tokenizer.eot_id, f"the constraint did not end the row: {new}"
        assert all(t < tokenizer.vocab_size for t in new)
        texts.append(tokenizer.decode(new[:-1]))
    return texts


@pytest.mark.parametrize("kind", list(CASES))
@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_every_output_is_accepted(setup, kind: str, mode: str) -> None:
    model, tokenizer = setup
    constraint, accepts = CASES[kind]
    extra = ["greedy"] if mode == "greedy" else [{"kind": "top_k", "k": 50}, {"kind": "temperature", "value": 1.3}]
    for seed in ([0] if mode == "greedy" else [0, 1]):
        texts = _outputs(model, tokenizer, PROMPTS, [*constraint, *extra], seed=seed)
        for text in texts:
            assert accepts(text), (kind, text)


def test_unconstrained_output_is_not_accepted(setup) -> None:
    """The model alone does not write the formats: the test above measures the mask, not luck."""
    model, tokenizer = setup
    ids = [tokenizer.encode(p) for p in PROMPTS]
    out = generate(model, ids, max_new_tokens=20, eos_token_id=tokenizer.eot_id)
    texts = [tokenizer.decode(row[len(p):]) for p, row in zip(ids, out)]
    assert not any(re.fullmatch(DATE, t) or t in OPTIONS for t in texts)


def test_a_row_is_the_same_alone_and_in_a_ragged_batch(setup) -> None:
    model, tokenizer = setup
    constraint = [*CASES["json_schema"][0], "greedy"]
    together = _outputs(model, tokenizer, PROMPTS, constraint)
    alone = [_outputs(model, tokenizer, [p], constraint)[0] for p in PROMPTS]
    assert together == alone


def test_the_grammar_output_is_accepted_by_llguidance_again() -> None:
    model = specformer.build(tiny_with(vocab_size=259, context_length=128), seed=0).eval()
    for text in _outputs(model, BYTES, PROMPTS, CASES["grammar"][0], seed=0):
        assert _grammar_accepts(LARK, text) and _parse_expr(text)


@pytest.mark.parametrize("kind", ["regex", "choice", "json_schema"])
def test_beam_search_outputs_are_accepted(setup, kind: str) -> None:
    model, tokenizer = setup
    constraint, accepts = CASES[kind]
    for text in _outputs(model, tokenizer, PROMPTS, constraint, num_beams=3):
        assert accepts(text), text


@pytest.mark.parametrize("kind", ["regex", "json_schema"])
def test_a_speculative_draft_gives_the_constrained_result(setup, kind: str) -> None:
    """Prompt lookup drafts tokens the constraint may forbid; they are rejected, and greedy output is unchanged."""
    model, tokenizer = setup
    constraint, accepts = CASES[kind]
    prompts = ['{"name": "ann", "age": 31, "ok": true} 2024-05-17 ', "x"]
    plain = _outputs(model, tokenizer, prompts, [*constraint, "greedy"])
    drafted = _outputs(model, tokenizer, prompts, [*constraint, "greedy"], draft="ngram", draft_tokens=3)
    assert drafted == plain
    assert all(accepts(t) for t in drafted)


def test_a_schema_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(SCHEMA))
    model = specformer.build(tiny_with(vocab_size=259, context_length=128), seed=0).eval()
    for text in _outputs(model, BYTES, PROMPTS[:2], [{"kind": "json_schema", "schema": str(path)}]):
        jsonschema.validate(json.loads(text), SCHEMA)


def test_refusals_in_python() -> None:
    model = specformer.build(tiny_with(vocab_size=259, context_length=128), seed=0).eval()
    regex = [{"kind": "regex", "pattern": "a+"}]
    with pytest.raises(ValueError, match="needs the model's tokenizer; pass tokenizer="):
        generate(model, [[1, 2]], max_new_tokens=3, sampler=regex, eos_token_id=256)
    with pytest.raises(ValueError, match="has no tokenizer"):
        generate(model, [[1, 2]], max_new_tokens=3, sampler=regex, eos_token_id=256,
                 tokenizer=NoTokenizer(vocab_size=259))
    with pytest.raises(ValueError, match="end-of-sequence token, and none was given"):
        generate(model, [[1, 2]], max_new_tokens=3, sampler=regex, tokenizer=BYTES)
    with pytest.raises(ValueError, match="must be the first entry"):
        generate(model, [[1, 2]], max_new_tokens=3, sampler=[{"kind": "top_k", "k": 3}, *regex], tokenizer=BYTES,
                 eos_token_id=256)
    with pytest.raises(ValueError, match="one constraint per sampler list"):
        generate(model, [[1, 2]], max_new_tokens=3, sampler=[*regex, *regex], tokenizer=BYTES, eos_token_id=256)
    with pytest.raises(ValueError, match=r"sampler\[0\]: regex: .*unclosed character class"):
        generate(model, [[1, 2]], max_new_tokens=3, sampler=[{"kind": "regex", "pattern": "[0-9"}], tokenizer=BYTES,
                 eos_token_id=256)
    with pytest.raises(ValueError, match="option 1 is empty"):
        generate(model, [[1, 2]], max_new_tokens=3, sampler=[{"kind": "choice", "options": ["a", ""]}],
                 tokenizer=BYTES, eos_token_id=256)


# -- the command line -------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ckpt") / "tiny.safetensors"
    specformer.save(specformer.build(tiny_with(vocab_size=259, context_length=128), seed=0), path)
    return path


def _cli(capsys, *args) -> tuple[int, str, str]:
    code = main(["generate", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_flags_constrain_the_output(capsys, checkpoint, tmp_path) -> None:
    schema, grammar = tmp_path / "s.json", tmp_path / "g.lark"
    schema.write_text(json.dumps(SCHEMA))
    grammar.write_text(LARK)
    for flag, value, kind in [("--regex", DATE, "regex"), ("--choice", ",".join(o for o in OPTIONS if "," not in o),
                                                           "choice"),
                              ("--json-schema", schema, "json_schema"), ("--grammar", grammar, "grammar")]:
        for extra in ([], ["--sampler", "[{kind: temperature, value: 1.5}]", "--seed", "4"]):
            code, out, err = _cli(capsys, checkpoint, "--prompt", "Q: ", "--max-new-tokens", 60, flag, value, *extra)
            assert code == 0, err
            assert out.startswith("Q: ") and out.endswith("\n")
            assert CASES[kind][1](out[len("Q: "):-1]), (flag, out)


def test_a_spec_generate_section_names_a_constraint(capsys, tmp_path) -> None:
    data = tiny_with(vocab_size=259, context_length=128)
    data["generate"] = {"sampler": [{"kind": "choice", "options": ["red", "green"]}], "max_new_tokens": 20}
    path = tmp_path / "choice.safetensors"
    specformer.save(specformer.build(data, seed=0), path)
    code, out, err = _cli(capsys, path, "--prompt", "colour: ", "--batch")
    assert code == 0, err
    assert out[len("colour: "):-1] in ("red", "green")


def _error(capsys, *args) -> str:
    code, out, err = _cli(capsys, *args)
    assert code == 2, (out, err)
    assert err.startswith("error: ") and "Traceback" not in err and err.count("\n") == 1, err
    return err


def test_bad_constraints_exit_2_with_one_line(capsys, checkpoint, tmp_path) -> None:
    assert "unclosed character class" in _error(capsys, checkpoint, "--prompt", "a", "--regex", "[0-9")
    bad_schema = tmp_path / "bad.json"
    bad_schema.write_text('{"type": "frobnicate"}')
    assert "Invalid type: frobnicate" in _error(capsys, checkpoint, "--prompt", "a", "--json-schema", bad_schema)
    dangling = tmp_path / "ref.json"
    dangling.write_text('{"$ref": "#/definitions/nowhere"}')
    assert "does not exist" in _error(capsys, checkpoint, "--prompt", "a", "--json-schema", dangling)
    assert "neither an object nor a JSON file" in _error(capsys, checkpoint, "--prompt", "a", "--json-schema",
                                                          tmp_path / "missing.json")
    bad_grammar = tmp_path / "bad.lark"
    bad_grammar.write_text("start: undefined_rule\n")
    assert 'unknown name: "undefined_rule"' in _error(capsys, checkpoint, "--prompt", "a", "--grammar", bad_grammar)
    assert "--grammar" in _error(capsys, checkpoint, "--prompt", "a", "--grammar", tmp_path / "missing.lark")
    assert "none was given" in _error(capsys, checkpoint, "--prompt", "a", "--regex", "a+", "--ignore-eos")
    assert "not chat yet" in _error(capsys, checkpoint, "--prompt", "a", "--regex", "a+", "--interactive")
    assert "one constraint per sampler list" in _error(capsys, checkpoint, "--prompt", "a", "--regex", "a+",
                                                       "--sampler", "[{kind: choice, options: [b]}]")
