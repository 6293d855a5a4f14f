"""``specformer generate --draft CKPT|ngram|mtp --draft-tokens K``: the same text, and clear errors for a mismatched draft."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import specformer
from specformer.cli.main import main

from .specs_for_tests import tiny_with


def byte_model(seed: int, **changes):
    return specformer.build(tiny_with(vocab_size=259, context_length=64, **changes), seed=seed)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("spec")
    paths = {name: folder / f"{name}.safetensors"
             for name in ("target", "draft", "other_tokenizer", "other_vocab", "with_mtp")}
    specformer.save(byte_model(0), paths["target"])
    specformer.save(byte_model(1, n_layers=1), paths["draft"])
    specformer.save(byte_model(1, n_layers=1), paths["other_tokenizer"],
                    metadata={"tokenizer": json.dumps({"kind": "none", "vocab_size": 259})})
    specformer.save(specformer.build(tiny_with(vocab_size=300, context_length=64), seed=1), paths["other_vocab"])
    specformer.save(byte_model(2, mtp={"depths": 2}), paths["with_mtp"])
    return paths


def run_cli(capsys, *args) -> tuple[int, str, str]:
    code = main(["generate", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_draft_checkpoint_and_ngram_print_the_plain_text(capsys, checkpoints) -> None:
    base = (checkpoints["target"], "--prompt", "abcabcabc", "--max-new-tokens", 20, "--ignore-eos", "--threads", 1)
    code, plain, _ = run_cli(capsys, *base)
    assert code == 0
    for draft in (checkpoints["draft"], "ngram"):
        code, out, err = run_cli(capsys, *base, "--draft", draft, "--draft-tokens", 3)
        assert code == 0, err
        assert out == plain
    code, out, err = run_cli(capsys, *base, "--draft", "ngram", "--stop", plain[12:14])
    assert code == 0 and out.startswith("abcabcabc") and out.rstrip("\n").endswith(plain[12:14])


def test_draft_mtp_prints_the_plain_text_and_a_model_without_depths_is_refused(capsys, checkpoints) -> None:
    base = ("--prompt", "abcabcabc", "--max-new-tokens", 20, "--ignore-eos", "--threads", 1)
    code, plain, _ = run_cli(capsys, checkpoints["with_mtp"], *base)
    assert code == 0
    code, out, err = run_cli(capsys, checkpoints["with_mtp"], *base, "--draft", "mtp", "--draft-tokens", 3)
    assert code == 0, err
    assert out == plain
    code, out, err = run_cli(capsys, checkpoints["target"], *base, "--draft", "mtp")
    assert code == 2 and out == "" and "Traceback" not in err
    assert err.startswith(f"error: --draft mtp drafts with the model's multi-token prediction depths (model.mtp in its "
                          f"spec), and {checkpoints['target']} has none; use --draft ngram (prompt lookup) or "
                          f"--draft CKPT")


@pytest.mark.parametrize("draft, message", [
    ("other_tokenizer", "stores a different tokenizer"),
    ("other_vocab", "vocabulary of 300 tokens"),
    ("missing", "ngram (prompt lookup), mtp (the model's multi-token prediction depths) or a draft checkpoint file"),
])
def test_a_mismatched_draft_is_one_clear_error(capsys, checkpoints, draft, message) -> None:
    path = checkpoints.get(draft, Path("no-such-draft.safetensors"))
    code, out, err = run_cli(capsys, checkpoints["target"], "--prompt", "hi", "--draft", path)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_draft_with_beams_or_a_bad_count_is_refused(capsys, checkpoints) -> None:
    for extra in (("--num-beams", 2), ("--draft-tokens", 0)):
        code, _, err = run_cli(capsys, checkpoints["target"], "--prompt", "hi", "--draft", "ngram", *extra)
        assert code == 2 and "draft" in err
