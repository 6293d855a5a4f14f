"""``specformer eval``: the figures it prints, --json, and each user error (exit 2, one clear message)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import specformer
from specformer.cli.main import main
from specformer_eval import evaluate_documents

from .support import BYTES, DOCUMENTS, byte_model, reference_nll, save_with_tokenizer


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_with_tokenizer(byte_model(), tmp_path_factory.mktemp("ckpt") / "model.safetensors")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    for i, text in enumerate(DOCUMENTS):
        (folder / f"doc{i}.txt").write_text(text, encoding="utf-8")
    (folder / "more.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in ("one line", "two\nlines")) + "\n")
    return folder


def run(capsys, *args) -> tuple[int, str, str]:
    code = main(["eval", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_output_matches_the_python_api_and_a_reference(capsys, checkpoint, corpus):
    code, out, err = run(capsys, checkpoint, "--data", corpus, "--context", 16, "--stride", 4, "--json")
    assert code == 0, err
    report = json.loads(out)
    texts = [(corpus / f"doc{i}.txt").read_text() for i in range(len(DOCUMENTS))] + ["one line", "two\nlines"]
    model = specformer.load(checkpoint)
    nll = sum(reference_nll(model, [BYTES.eot_id, *BYTES.encode(t)], context=16, stride=4)[0] for t in texts)
    n_tokens = sum(len(t.encode()) for t in texts)
    assert report["tokens"] == n_tokens and report["bytes"] == n_tokens  # bytes are tokens for this tokenizer
    assert report["loss"] == pytest.approx(nll / n_tokens, rel=1e-5)
    assert report["perplexity"] == pytest.approx(math.exp(nll / n_tokens), rel=1e-5)
    assert report["bits_per_byte"] == pytest.approx(nll / n_tokens / math.log(2), rel=1e-5)
    assert (report["context"], report["stride"], report["documents"]) == (16, 4, 5)
    # The folder's documents in its own order, through the Python API.
    same = evaluate_documents(model, BYTES, sorted(texts[: len(DOCUMENTS)]) + texts[len(DOCUMENTS):], context=16, stride=4)
    assert report["loss"] == pytest.approx(same.loss, rel=1e-6)


def test_the_table_names_every_figure(capsys, checkpoint, corpus):
    code, out, err = run(capsys, checkpoint, "--data", corpus / "doc0.txt")
    assert code == 0, err
    for label in ("loss", "perplexity", "bits per byte", "tokens/s", "context 32, stride 32"):
        assert label in out


def test_a_glob_and_a_token_array(capsys, checkpoint, corpus, tmp_path):
    code, out, _ = run(capsys, checkpoint, "--data", f"{corpus}/doc[01].txt", "--json")
    assert code == 0 and json.loads(out)["documents"] == 2
    tokens = np.array(BYTES.encode(DOCUMENTS[0]), dtype=np.uint16)
    np.save(tmp_path / "tokens.npy", tokens)
    code, out, _ = run(capsys, checkpoint, "--data", tmp_path / "tokens.npy", "--json")
    report = json.loads(out)
    assert code == 0 and report["tokens"] == len(tokens) - 1 and report["bits_per_byte"] is None


def test_a_bad_path(capsys, checkpoint, tmp_path):
    code, out, err = run(capsys, checkpoint, "--data", tmp_path / "missing.txt")
    assert code == 2 and out == ""
    assert "missing.txt" in err and "no such file or directory" in err and "Traceback" not in err


def test_an_empty_file(capsys, checkpoint, tmp_path):
    (tmp_path / "empty.txt").write_text("")
    code, _, err = run(capsys, checkpoint, "--data", tmp_path / "empty.txt")
    assert code == 2 and "the corpus is empty" in err and "Traceback" not in err


def test_a_checkpoint_without_its_tokenizer(capsys, tmp_path, corpus):
    """A vocabulary other than the byte tokenizer's, and no tokenizer in the header: refused, --tokenizer named."""
    path = specformer.save(byte_model(vocab_size=300), tmp_path / "bare.safetensors")
    code, _, err = run(capsys, path, "--data", corpus)
    assert code == 2
    assert "stores no tokenizer" in err and "300" in err and "--tokenizer" in err
    code, _, err = run(capsys, path, "--data", corpus, "--tokenizer", tmp_path / "nope.json")
    assert code == 2 and "nope.json" in err and "no such file" in err


def test_a_missing_checkpoint_and_bad_windows(capsys, checkpoint, corpus, tmp_path):
    code, _, err = run(capsys, tmp_path / "nothing.safetensors", "--data", corpus)
    assert code == 2 and "no such checkpoint file" in err
    learned = save_with_tokenizer(byte_model(positional={"kind": "learned"}), tmp_path / "learned.safetensors")
    code, _, err = run(capsys, learned, "--data", corpus, "--context", 64)
    assert code == 2 and err.strip() == ("error: --context 64 is longer than the model's context length 32 (its "
                                         "LearnedPositions has no position past it); use --context 32 or less")
    code, _, err = run(capsys, checkpoint, "--data", corpus, "--context", 8, "--stride", 9)
    assert code == 2 and "--stride 9 is larger than the context (8)" in err
    code, _, err = run(capsys, checkpoint)
    assert code == 2 and "--data" in err


def test_a_context_past_the_models_where_its_positions_allow_it(capsys, checkpoint, corpus):
    """RoPE ("warn"): scored, with one note on stderr instead of the forward's warning."""
    code, out, err = run(capsys, checkpoint, "--data", corpus, "--context", 64, "--json")
    assert code == 0 and json.loads(out)["context"] == 64
    assert err.count("note: --context 64 is past the model's context length of 32: its positions (RotaryPositions) "
                     "were never trained there, so the loss may be higher") == 1
    assert "UserWarning" not in err


def test_tasks_without_the_eval_extra_say_how_to_install_it(capsys, checkpoint, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "lm_eval" else real(name, *a))
    code, out, err = run(capsys, checkpoint, "--tasks", "hellaswag")
    assert code == 2 and out == ""
    assert "pip install 'specformer[eval]'" in err and "Traceback" not in err
    code, _, err = run(capsys, checkpoint, "--tasks", " , ")
    assert code == 2 and "names no task" in err
