"""``checkpoint_tokenizer``: one rule for which tokenizer a checkpoint uses, and every command following it.

A header without a tokenizer entry is byte-level exactly when the vocabulary is the byte
tokenizer's 259 ids (``specformer.save(specformer.build(...))`` writes such files); any
other vocabulary, and a header recording that there is none, is refused with the same
hint by generate, eval, inspect and train --init.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

import specformer
from specformer.tokenizers.byte_file import byte_tokenizer_json
from specformer.cli.main import main
from specformer.errors import UserError
from specformer.tokenizers.tokenizer import METADATA_KEY, ByteTokenizer, NoTokenizer
from specformer.tokenizers.choice import BYTE_VOCAB_SIZE, checkpoint_tokenizer, tokenizer_file
from fixtures.tiny import tiny_spec

def model_spec(vocab_size: int) -> dict[str, Any]:
    return tiny_spec(vocab_size=vocab_size, n_layers=1,
                     block={"mixer": {"kind": "attention", "n_heads": 2}, "ffn": {"kind": "swiglu", "hidden": 64}})


@pytest.fixture(autouse=True)
def _one_thread_private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("SPECFORMER_CACHE", str(tmp_path_factory.mktemp("cache")))
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


# -- the rule ------------------------------------------------------------------------------


def test_a_header_without_an_entry_is_bytes_only_at_the_byte_vocabulary() -> None:
    assert BYTE_VOCAB_SIZE == 259
    assert isinstance(checkpoint_tokenizer({}, vocab_size=259, where="m.safetensors"), ByteTokenizer)
    with pytest.raises(UserError) as info:
        checkpoint_tokenizer({}, vocab_size=300, where="m.safetensors")
    assert str(info.value) == (
        "m.safetensors: stores no tokenizer, and its vocabulary of 300 ids is not the byte tokenizer's (259), so text "
        "cannot be encoded for it; store its tokenizer.json in the file with `specformer hf attach-tokenizer "
        "m.safetensors TOKENIZER.json`, or pass --tokenizer TOKENIZER.json (generate, chat, eval, inspect); generate "
        "and chat also take token ids with --ids")
    for vocab in (258, 260):  # the boundary both ways
        with pytest.raises(UserError, match="stores no tokenizer"):
            checkpoint_tokenizer({}, vocab_size=vocab, where="m")


def test_a_stored_tokenizer_wins_over_the_vocabulary_and_a_recorded_none_is_refused() -> None:
    stored = {METADATA_KEY: ByteTokenizer().to_json()}
    assert isinstance(checkpoint_tokenizer(stored, vocab_size=300, where="m"), ByteTokenizer)
    none = {METADATA_KEY: json.dumps({"kind": "none", "vocab_size": 259, "eot_id": 5})}
    with pytest.raises(UserError) as info:
        checkpoint_tokenizer(none, vocab_size=259, where="m")  # recorded as none: not bytes, even at 259
    message = str(info.value)
    assert message.startswith("m: has no tokenizer (it was imported from a Hugging Face folder without tokenizer.json")
    assert "attach-tokenizer m TOKENIZER.json" in message and "--tokenizer" in message and "--ids" in message


def test_ids_only_gets_a_tokenizer_that_refuses_text_instead_of_the_refusal() -> None:
    none = {METADATA_KEY: json.dumps({"kind": "none", "vocab_size": 259, "eot_id": 5})}
    found = checkpoint_tokenizer(none, vocab_size=259, where="m", ids_only=True)
    assert isinstance(found, NoTokenizer) and found.eot_id == 5  # the recorded end-of-text id is kept
    found = checkpoint_tokenizer({}, vocab_size=300, where="m", ids_only=True)
    assert isinstance(found, NoTokenizer) and found.vocab_size == 300 and found.eot_id is None
    assert isinstance(checkpoint_tokenizer({}, vocab_size=259, where="m", ids_only=True), ByteTokenizer)


def test_an_override_file(tmp_path: Path) -> None:
    specformer_json = tmp_path / "byte.json"
    specformer_json.write_text(ByteTokenizer().to_json())
    hf_json = tmp_path / "tokenizer.json"
    hf_json.write_text(json.dumps(byte_tokenizer_json()))
    none = {METADATA_KEY: json.dumps({"kind": "none", "vocab_size": 300})}
    for path in (specformer_json, hf_json):  # the byte tokenizer's tokenizer.json reads back as the byte tokenizer
        assert isinstance(checkpoint_tokenizer(none, vocab_size=300, where="m", override=path), ByteTokenizer)
        assert isinstance(tokenizer_file(path, option="--tokenizer"), ByteTokenizer)
    with pytest.raises(UserError, match=r"has 259 tokens but the model of m has only 100 embedding rows"):
        checkpoint_tokenizer({}, vocab_size=100, where="m", override=specformer_json)
    with pytest.raises(UserError, match=r"--tokenizer '.*nope.json': no such file"):
        checkpoint_tokenizer({}, vocab_size=259, where="m", override=tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(UserError, match="not a readable JSON tokenizer"):
        checkpoint_tokenizer({}, vocab_size=259, where="m", override=tmp_path / "bad.json")


# -- every command follows it ---------------------------------------------------------------


def _generate(path: Path, tmp_path: Path) -> list[str]:
    return ["generate", str(path), "--prompt", "ab", "--max-new-tokens", "2", "--threads", "1"]


def _eval(path: Path, tmp_path: Path) -> list[str]:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("some text to measure the model on, long enough for a window or two\n" * 2, encoding="utf-8")
    return ["eval", str(path), "--data", str(corpus)]


def _inspect(path: Path, tmp_path: Path) -> list[str]:
    return ["inspect", str(path), "--prompt", "ab", "--out", str(tmp_path / "pictures")]


def _train_init(path: Path, tmp_path: Path) -> list[str]:
    corpus = tmp_path / "notes.txt"
    corpus.write_text("the model reads tokens and predicts the next one\n" * 40, encoding="utf-8")
    spec = {**specformer.load(path).spec.to_dict(), "train": {
        "steps": 1, "batch_size": 2, "seq_len": 16, "eval_every": 0, "save_every": 0, "sample_tokens": 0,
        "progress": False, "plot": False, "tensorboard": False, "threads": 1}}
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump({"model": spec["model"], "train": spec["train"]}), encoding="utf-8")
    return ["train", str(spec_path), "--data", str(corpus), "--out", str(tmp_path / "run"), "--init", str(path)]


COMMANDS = {"generate": _generate, "eval": _eval, "inspect": _inspect, "train --init": _train_init}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_259_token_checkpoint_without_a_tokenizer_is_byte_level_everywhere(command: str, tmp_path: Path,
                                                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = specformer.save(specformer.build(model_spec(259), seed=0), tmp_path / "bare.safetensors")  # no tokenizer
    code = main(COMMANDS[command](path, tmp_path))
    err = capsys.readouterr().err
    assert code == 0, err


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_300_token_checkpoint_without_a_tokenizer_is_refused_the_same_way_everywhere(
        command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = specformer.save(specformer.build(model_spec(300), seed=0), tmp_path / "bare.safetensors")
    code = main(COMMANDS[command](path, tmp_path))
    out, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in err
    with pytest.raises(UserError) as expected:
        checkpoint_tokenizer({}, vocab_size=300, where=str(path))
    line = err.strip().splitlines()[-1]
    assert line.removeprefix("error: ").removeprefix("train.init: ") == str(expected.value)
