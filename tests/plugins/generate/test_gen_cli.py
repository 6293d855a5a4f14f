"""``specformer generate``: output, streaming, sampler options, spec defaults, and user errors (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import specformer
from specformer.cli.main import main
from specformer.tokenizers.tokenizer import ByteTokenizer
from specformer_generate import generate

from .specs_for_tests import tiny_with

BYTES = ByteTokenizer()


def byte_model_spec(**generate_section) -> dict:
    data = tiny_with(vocab_size=259, context_length=64)
    if generate_section:
        data["generate"] = generate_section
    return data


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ckpt") / "tiny.safetensors"
    specformer.save(specformer.build(byte_model_spec(), seed=0), path)
    return path


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["generate", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def expected_text(path: Path, prompt: str, n: int, **kwargs) -> str:
    model = specformer.load(path)
    ids = BYTES.encode(prompt)
    out = generate(model, [ids], max_new_tokens=n, eos_token_id=kwargs.pop("eos", [BYTES.eot_id]), **kwargs)[0]
    return prompt + BYTES.decode(out[len(ids):])


def test_prints_the_continuation_and_the_speed(capsys, checkpoint) -> None:
    code, out, err = run_cli(capsys, checkpoint, "--prompt", "Hello", "--max-new-tokens", 12)
    assert code == 0
    assert out == expected_text(checkpoint, "Hello", 12) + "\n"
    assert "tokens/s" in err and err.count("\n") == 1


def test_the_default_number_of_new_tokens_is_cut_to_fit_the_context(capsys, checkpoint) -> None:
    """The command the demo prints: 128 new tokens by default, on a 64-token model."""
    code, out, err = run_cli(capsys, checkpoint, "--prompt", "def ", "--ignore-eos")
    assert code == 0, err
    assert "note: generating at most 60 new tokens" in err and "64-token context" in err
    assert out == expected_text(checkpoint, "def ", 60, eos=None) + "\n"


def test_a_default_that_fits_prints_no_note(capsys, tmp_path) -> None:
    path = tmp_path / "short-default.safetensors"
    specformer.save(specformer.build(byte_model_spec(max_new_tokens=5), seed=0), path)
    code, out, err = run_cli(capsys, path, "--prompt", "def ", "--ignore-eos")
    assert code == 0 and "note" not in err
    assert out == expected_text(path, "def ", 5, eos=None) + "\n"


@pytest.fixture(scope="module")
def learned_checkpoint(tmp_path_factory) -> Path:
    """Learned absolute positions: no position past the context (Decoder.past_context says "no")."""
    path = tmp_path_factory.mktemp("learned") / "learned.safetensors"
    data = byte_model_spec()
    data["model"]["positional"] = {"kind": "learned"}
    specformer.save(specformer.build(data, seed=0), path)
    return path


def test_an_explicit_max_new_tokens_that_does_not_fit_says_the_limit(capsys, learned_checkpoint) -> None:
    err = _error(capsys, learned_checkpoint, "--prompt", "def ", "--max-new-tokens", 61)
    assert ("exceeds the model's context of 64 tokens (its LearnedPositions has no position past it); "
            "use --max-new-tokens 60 or less") in err
    err = _error(capsys, learned_checkpoint, "--prompt", "x" * 64)
    assert "the prompt is 64 tokens long, but the model's context is 64 tokens" in err


def test_past_the_context_the_command_follows_the_positional_policy(capsys, checkpoint, tmp_path) -> None:
    """RoPE was never trained past the context: one note, then the same tokens generate() gives; ALiBi: silent."""
    code, out, err = run_cli(capsys, checkpoint, "--prompt", "def ", "--max-new-tokens", 70, "--ignore-eos")
    assert code == 0, err
    assert err.count("note: generating 74 tokens, past the model's 64-token context") == 1
    assert "Warning" not in err  # the library's warning is not said a second time
    with pytest.warns(UserWarning, match="past the model's context"):  # the reference, through generate() itself
        assert out == expected_text(checkpoint, "def ", 70, eos=None) + "\n"
    code, _, err = run_cli(capsys, checkpoint, "--prompt", "x" * 70, "--max-new-tokens", 2, "--ignore-eos")
    assert code == 0 and "note: generating 72 tokens" in err
    alibi = tmp_path / "alibi.safetensors"
    data = byte_model_spec()
    data["model"]["positional"] = {"kind": "alibi"}
    specformer.save(specformer.build(data, seed=0), alibi)
    code, out, err = run_cli(capsys, alibi, "--prompt", "def ", "--max-new-tokens", 70, "--ignore-eos")
    assert code == 0 and "note" not in err and len(out) > 0


def test_stream_prints_the_same_text(capsys, checkpoint) -> None:
    _, plain, _ = run_cli(capsys, checkpoint, "--prompt", "abc", "--max-new-tokens", 15)
    code, streamed, err = run_cli(capsys, checkpoint, "--prompt", "abc", "--max-new-tokens", 15, "--stream")
    assert code == 0 and streamed == plain
    assert "tokens/s" in err


def test_inline_sampler_and_seed(capsys, checkpoint) -> None:
    sampler = "[{kind: top_k, k: 20}, {kind: temperature, value: 1.3}]"
    runs = [run_cli(capsys, checkpoint, "--prompt", "xy", "--max-new-tokens", 20, "--sampler", sampler, "--seed", s)
            for s in (4, 4, 5)]
    assert runs[0][0] == 0 and runs[0][1] == runs[1][1] != runs[2][1]
    steps = [{"kind": "top_k", "k": 20}, {"kind": "temperature", "value": 1.3}]
    assert runs[0][1] == expected_text(checkpoint, "xy", 20, sampler=steps, seed=4) + "\n"


@pytest.mark.parametrize("form", ["list", "spec", "json"])
def test_sampler_from_a_file(capsys, checkpoint, tmp_path, form: str) -> None:
    steps = [{"kind": "repetition_penalty", "penalty": 2.0}, "greedy"]
    if form == "list":
        path = tmp_path / "sampler.yaml"
        path.write_text("- {kind: repetition_penalty, penalty: 2.0}\n- greedy\n")
    elif form == "spec":
        path = tmp_path / "spec.yaml"
        path.write_text("generate:\n  sampler: [{kind: repetition_penalty, penalty: 2.0}, greedy]\n")
    else:
        path = tmp_path / "sampler.json"
        path.write_text(json.dumps({"sampler": steps}))
    code, out, _ = run_cli(capsys, checkpoint, "--prompt", "aaaa", "--max-new-tokens", 10, "--sampler", path)
    assert code == 0
    assert out == expected_text(checkpoint, "aaaa", 10, sampler=steps) + "\n"


def test_the_spec_generate_section_gives_the_defaults(capsys, tmp_path) -> None:
    path = tmp_path / "with-section.safetensors"
    section = {"max_new_tokens": 7, "sampler": [{"kind": "top_k", "k": 5}], "seed": 11}
    specformer.save(specformer.build(byte_model_spec(**section), seed=0), path)
    code, out, _ = run_cli(capsys, path, "--prompt", "Hi", "--ignore-eos")
    assert code == 0
    assert out == expected_text(path, "Hi", 7, eos=None, sampler=[{"kind": "top_k", "k": 5}], seed=11) + "\n"
    assert len(out) - 1 <= len("Hi") + 7 * 3  # at most 7 tokens (a replacement char is 3 bytes of text)


def test_beam_search_flag(capsys, checkpoint) -> None:
    code, out, _ = run_cli(capsys, checkpoint, "--prompt", "The", "--max-new-tokens", 6, "--num-beams", 3)
    assert code == 0
    assert out == expected_text(checkpoint, "The", 6, num_beams=3) + "\n"


def test_the_tokenizer_stored_in_the_checkpoint_is_used(capsys, tmp_path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    from specformer.tokenizers.tokenizer import BPETokenizer

    inner = tokenizers.Tokenizer(tokenizers.models.BPE())
    inner.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    inner.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    inner.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 50, trainer=trainer)
    bpe = BPETokenizer(inner)
    path = tmp_path / "bpe.safetensors"
    model = specformer.build(tiny_with(vocab_size=bpe.vocab_size, context_length=64), seed=0)
    specformer.save(model, path, metadata={"tokenizer": bpe.to_json()})
    code, out, _ = run_cli(capsys, path, "--prompt", "the quick", "--max-new-tokens", 5)
    assert code == 0
    ids = bpe.encode("the quick")
    new = generate(model, [ids], max_new_tokens=5, eos_token_id=bpe.eot_id)[0][len(ids):]
    assert out == "the quick" + bpe.decode(new) + "\n"


def _error(capsys, *args: str) -> str:
    code, out, err = run_cli(capsys, *args)
    assert code == 2, (out, err)
    assert err.startswith("error: ") and "Traceback" not in err
    return err


def test_user_errors_exit_2_with_one_clear_message(capsys, checkpoint, learned_checkpoint, tmp_path) -> None:
    assert "--prompt is empty" in _error(capsys, checkpoint, "--prompt", "")
    assert "shorten the prompt to at most 63 tokens" in _error(capsys, learned_checkpoint, "--prompt", "x" * 80)
    assert "use --max-new-tokens 34 or less" in _error(capsys, learned_checkpoint, "--prompt", "y" * 30,
                                                       "--max-new-tokens", 50)
    assert "no such checkpoint file" in _error(capsys, tmp_path / "missing.safetensors", "--prompt", "a")
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x00\x01 not a safetensors file at all")
    assert "not a readable safetensors checkpoint" in _error(capsys, garbage, "--prompt", "a")
    from safetensors.torch import save_file

    foreign = tmp_path / "foreign.safetensors"
    save_file({"w": torch.zeros(2)}, str(foreign))
    assert "not a specformer checkpoint" in _error(capsys, foreign, "--prompt", "a")
    assert "--max-new-tokens must be at least 1" in _error(capsys, checkpoint, "--prompt", "a", "--max-new-tokens", 0)
    assert "--stream cannot show beam search" in _error(capsys, checkpoint, "--prompt", "a", "--stream", "--num-beams", 2)


@pytest.mark.parametrize(
    "sampler, message",
    [
        ("[{kind: top_p, p: 1.5}]", "--sampler[0].p"),
        ("[{kind: top_k, k: 0}, {kind: nope}]", "--sampler[1].kind: unknown sampler 'nope'"),
        ("[greedy, {kind: top_k, k: 3}]", "must be the last entry"),
        ("[{kind: top_k, k: 3", "neither a file nor valid inline YAML/JSON"),
        ("42", "must give a list of sampler components"),
        ("missing.yaml", "--sampler missing.yaml: no such file"),
    ],
)
def test_bad_sampler_options(capsys, checkpoint, sampler: str, message: str) -> None:
    assert message in _error(capsys, checkpoint, "--prompt", "a", "--sampler", sampler)


def test_corrupt_tensors_are_a_checkpoint_error(capsys, checkpoint, tmp_path) -> None:
    data = bytearray(checkpoint.read_bytes())
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(bytes(data[: len(data) // 2]))
    err = _error(capsys, truncated, "--prompt", "a")
    assert str(truncated) in err


@pytest.mark.slow  # a subprocess (3.5 s)
def test_the_console_script_runs(checkpoint) -> None:
    exe = Path(sys.executable).with_name("specformer")
    result = subprocess.run([str(exe), "generate", str(checkpoint), "--prompt", "ok", "--max-new-tokens", "4"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok") and "tokens/s" in result.stderr


def test_an_error_is_one_line_on_stderr(capsys, checkpoint) -> None:
    code, out, err = run_cli(capsys, checkpoint, "--prompt", "")
    assert (code, out) == (2, "")
    assert err == "error: --prompt is empty; give at least one character of text to continue\n"
