"""``specformer generate`` prompt sources, --batch, --stop, --ids, no-tokenizer checkpoints, --threads,
--max-memory, and ``specformer chat`` (the KV cache kept between turns)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import specformer
from specformer.cli.main import main
from specformer.tokenizers.tokenizer import ByteTokenizer
from specformer_generate import generate

from .specs_for_tests import tiny_with

BYTES = ByteTokenizer()
EXE = Path(sys.executable).with_name("specformer")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ckpt") / "tiny.safetensors"
    specformer.save(specformer.build(tiny_with(vocab_size=259, context_length=64), seed=0), path)
    return path


@pytest.fixture(autouse=True)
def _keep_thread_count():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def run_cli(capsys, *args, stdin: bytes | None = None, monkeypatch=None) -> tuple[int, str, str]:
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    code = main(["generate", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def continuation(path: Path, prompts: list[str], n: int, **kwargs) -> list[list[int]]:
    model = specformer.load(path).eval()
    ids = [BYTES.encode(p) for p in prompts]
    out = generate(model, ids, max_new_tokens=n, **kwargs)
    return [row[len(p):] for row, p in zip(out, ids)]


def test_prompt_file_and_standard_input_give_what_prompt_gives(capsys, monkeypatch, checkpoint, tmp_path) -> None:
    _, expected, _ = run_cli(capsys, checkpoint, "--prompt", "def f", "--max-new-tokens", 8, "--ignore-eos")
    path = tmp_path / "prompt.txt"
    path.write_text("def f\n", encoding="utf-8")  # one final newline is dropped
    code, out, _ = run_cli(capsys, checkpoint, "--prompt-file", path, "--max-new-tokens", 8, "--ignore-eos")
    assert code == 0 and out == expected
    code, out, _ = run_cli(capsys, checkpoint, "--prompt-file", "-", "--max-new-tokens", 8, "--ignore-eos",
                           stdin=b"def f\n", monkeypatch=monkeypatch)
    assert code == 0 and out == expected
    assert expected == "def f" + BYTES.decode(continuation(checkpoint, ["def f"], 8)[0]) + "\n"


def _error(capsys, *args, **kwargs) -> str:
    code, out, err = run_cli(capsys, *args, **kwargs)
    assert code == 2, (out, err)
    assert err.startswith("error: ") and "Traceback" not in err
    return err


def test_prompts_that_are_not_utf8_are_one_clear_error(capsys, monkeypatch, checkpoint, tmp_path) -> None:
    path = tmp_path / "latin1.txt"
    path.write_bytes("caf\xe9".encode("latin-1"))
    assert "is not UTF-8 text (byte 0xe9 at offset 3)" in _error(capsys, checkpoint, "--prompt-file", path)
    err = _error(capsys, checkpoint, "--prompt-file", "-", stdin=b"\xff\xfeab", monkeypatch=monkeypatch)
    assert "standard input is not UTF-8 text (byte 0xff at offset 0)" in err
    surrogate = b"caf\xe9".decode("utf-8", "surrogateescape")  # how Python passes such argv bytes
    assert "--prompt is not UTF-8 text (byte 0xe9 at character 3)" in _error(capsys, checkpoint, "--prompt", surrogate)


class _Terminal(io.TextIOWrapper):
    """Standard input on a terminal: nothing piped, so nothing may be waited for."""

    def isatty(self) -> bool:
        return True


def test_piped_standard_input_is_the_prompt_when_no_option_gives_one(capsys, monkeypatch, checkpoint) -> None:
    """`echo "def f" | specformer generate CKPT`, as Unix filters read their input."""
    _, expected, _ = run_cli(capsys, checkpoint, "--prompt", "def f", "--max-new-tokens", 8, "--ignore-eos")
    code, out, err = run_cli(capsys, checkpoint, "--max-new-tokens", 8, "--ignore-eos", stdin=b"def f\n",
                             monkeypatch=monkeypatch)
    assert code == 0 and out == expected, err
    code, out, _ = run_cli(capsys, checkpoint, "--prompt", "def f", "--max-new-tokens", 8, "--ignore-eos",
                           stdin=b"something else\n", monkeypatch=monkeypatch)  # an option wins over the pipe
    assert code == 0 and out == expected
    code, out, _ = run_cli(capsys, checkpoint, "--ids", "--max-new-tokens", 2, "--ignore-eos", stdin=b"100 101\n",
                           monkeypatch=monkeypatch)
    assert code == 0 and out.startswith("100 101 ")
    err = _error(capsys, checkpoint, stdin=b"", monkeypatch=monkeypatch)
    assert "standard input is empty" in err


def test_a_terminal_on_standard_input_is_not_read(capsys, monkeypatch, checkpoint) -> None:
    monkeypatch.setattr(sys, "stdin", _Terminal(io.BytesIO(b"def f\n")))
    err = _error(capsys, checkpoint)
    assert "give the text to continue with --prompt TEXT, --prompt-file PATH, or on standard input" in err
    assert sys.stdin.read() == "def f\n"  # left unread


def test_missing_or_doubled_prompts_are_errors(capsys, checkpoint, tmp_path) -> None:
    assert "give the text to continue with --prompt TEXT" in _error(capsys, checkpoint)
    assert "not both" in _error(capsys, checkpoint, "--prompt", "a", "--prompt-file", "x.txt")
    assert "no such file" in _error(capsys, checkpoint, "--prompt-file", tmp_path / "nope.txt")


def test_batch_prints_each_prompt_with_its_continuation(capsys, monkeypatch, checkpoint) -> None:
    prompts = ["def main", "x", "import os"]
    code, out, _ = run_cli(capsys, checkpoint, "--prompt-file", "-", "--batch", "--max-new-tokens", 6, "--ignore-eos",
                           stdin="\n".join(prompts[:2]).encode() + b"\n\n" + prompts[2].encode() + b"\n",
                           monkeypatch=monkeypatch)
    assert code == 0
    news = continuation(checkpoint, prompts, 6)
    assert out == "\n".join(p + BYTES.decode(n) + "\n" for p, n in zip(prompts, news))


def test_stop_strings_end_the_text_and_are_kept(capsys, checkpoint) -> None:
    new = BYTES.decode(continuation(checkpoint, ["abc"], 30)[0])
    stop = next(new[i : i + 2] for i in range(3, len(new) - 2) if "\ufffd" not in new[i : i + 2])
    expected = "abc" + new[: new.index(stop) + len(stop)] + "\n"
    for extra in ([], ["--stream"], ["--stop", "\x00never"]):
        code, out, _ = run_cli(capsys, checkpoint, "--prompt", "abc", "--max-new-tokens", 30, "--ignore-eos",
                               "--stop", stop, *extra)
        assert code == 0 and out == expected, extra
    assert "--stop needs some text" in _error(capsys, checkpoint, "--prompt", "a", "--stop", "")


def test_token_id_prompts_print_ids(capsys, checkpoint) -> None:
    code, out, _ = run_cli(capsys, checkpoint, "--ids", "--prompt", "100, 101 102", "--max-new-tokens", 5,
                           "--ignore-eos")
    assert code == 0
    new = generate(specformer.load(checkpoint).eval(), [[100, 101, 102]], max_new_tokens=5)[0][3:]
    assert out == " ".join(map(str, [100, 101, 102] + new)) + "\n"
    assert "token ids separated by spaces" in _error(capsys, checkpoint, "--ids", "--prompt", "1 two")
    assert "token id 300 is outside the model's vocabulary of 259" in _error(capsys, checkpoint, "--ids",
                                                                             "--prompt", "300")


def test_a_checkpoint_without_a_tokenizer_refuses_text_and_takes_ids(capsys, tmp_path) -> None:
    path = tmp_path / "no-tokenizer.safetensors"
    model = specformer.build(tiny_with(vocab_size=100, context_length=64), seed=0)
    specformer.save(model, path, metadata={"tokenizer": json.dumps({"kind": "none", "vocab_size": 100})})
    err = _error(capsys, path, "--prompt", "hello")
    assert "has no tokenizer" in err and "attach-tokenizer" in err and "--ids" in err
    code, out, _ = run_cli(capsys, path, "--ids", "--prompt", "1 2 3", "--max-new-tokens", 4)
    assert code == 0
    assert out == " ".join(map(str, generate(model.eval(), [[1, 2, 3]], max_new_tokens=4)[0])) + "\n"


def test_threads_flag_and_auto(capsys, monkeypatch, checkpoint) -> None:
    code, _, err = run_cli(capsys, checkpoint, "--prompt", "a", "--max-new-tokens", 2, "--threads", 1)
    assert code == 0 and torch.get_num_threads() == 1 and "1 CPU thread)" in err
    import specformer.machine.threads as threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (1000.0, 0.0, 0.0))  # every core busy
    torch.set_num_threads(2)
    code, _, err = run_cli(capsys, checkpoint, "--prompt", "a", "--max-new-tokens", 2)
    assert code == 0 and torch.get_num_threads() == 1
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (0.0, 0.0, 0.0))  # idle: PyTorch's default
    run_cli(capsys, checkpoint, "--prompt", "a", "--max-new-tokens", 2)
    assert torch.get_num_threads() == threads._DEFAULT
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    run_cli(capsys, checkpoint, "--prompt", "a", "--max-new-tokens", 2)
    assert torch.get_num_threads() == 3
    assert "--threads must be a number >= 1 or auto" in _error(capsys, checkpoint, "--prompt", "a", "--threads", "0")


def test_memory_limits_from_the_flag_and_the_environment(capsys, monkeypatch, checkpoint) -> None:
    err = _error(capsys, checkpoint, "--prompt", "a", "--max-new-tokens", 4, "--max-memory", "1KiB")
    assert "more than the limit of 1.0 KiB (max_memory=1KiB)" in err
    monkeypatch.setenv("SPECFORMER_MAX_MEMORY", "1GiB")
    err = _error(capsys, checkpoint, "--prompt", "a", "--max-new-tokens", 4, "--num-beams", 1000000)
    assert "beam search with 1000000 beams needs about" in err and "--max-memory" in err
    assert "--max-memory: max_memory must be a size" in _error(capsys, checkpoint, "--prompt", "a",
                                                               "--max-memory", "much")


def test_a_yaml_alias_bomb_in_a_sampler_file_ends_quickly(capsys, checkpoint, tmp_path) -> None:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 9):
        lines.append(f"{chr(97 + i)}: &{chr(97 + i)} [{','.join(['*' + chr(96 + i)] * 9)}]")
    lines.append("sampler: [{kind: top_k, k: *i}]")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    start = time.perf_counter()
    err = _error(capsys, checkpoint, "--prompt", "a", "--sampler", bomb)
    assert time.perf_counter() - start < 20
    assert "--sampler" in err and len(err) < 2000


# -- chat: a session on standard input ---------------------------------------------------


def test_a_session_runs_each_token_once_and_replies_as_generate_does(checkpoint) -> None:
    from specformer_generate.session import Session

    model = specformer.load(checkpoint).eval()
    seen = []
    handle = model.register_forward_pre_hook(lambda m, args, kwargs: seen.append(args[0].shape[1]), with_kwargs=True)
    session = Session(model)
    turns: list[tuple[list[int], list[int]]] = []
    try:
        for turn in ("hi\n", "and then\n", "ok\n"):
            ids = BYTES.encode(turn)
            session.append(ids)
            turns.append((ids, list(session.reply(max_new_tokens=6))))
    finally:
        handle.remove()
    history: list[int] = []
    for ids, reply in turns:  # each reply is what generate() gives on the whole conversation so far
        history += ids
        assert reply == generate(model, [history], max_new_tokens=6)[0][len(history):]
        history += reply
    assert session.tokens == history
    assert sum(seen) == session.tokens_run == len(history) - 1  # each token once; the last one is pending
    assert seen[0] == 3 and seen[6] == 1 + len("and then\n")  # a turn runs the pending token and its own


def _expected_chat(checkpoint: Path, turns: list[str], n: int) -> str:
    """The transcript a chat driven through a pipe writes: each turn marked ``user:``, each reply ``assistant:``."""
    model = specformer.load(checkpoint).eval()
    history: list[int] = []
    out = ""
    for turn in turns:
        history += BYTES.encode(turn)
        reply = generate(model, [history], max_new_tokens=n)[0][len(history):]
        history += reply
        text = BYTES.decode(reply)
        out += f"user: {turn.rstrip()}\nassistant: " + text + ("" if text.endswith("\n") else "\n")
    return out


@pytest.mark.slow  # a subprocess each (3.5 s)
@pytest.mark.parametrize("command", [["chat"], ["generate", "--interactive"]])
def test_chat_reads_turns_from_standard_input(checkpoint, command: list[str]) -> None:
    turns = ["def f(x):\n", "    return\n"]
    result = subprocess.run([str(EXE), *command, str(checkpoint), "--max-new-tokens", "5", "--ignore-eos",
                             "--threads", "1"],
                            input="".join(turns).encode(), capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.decode() == _expected_chat(checkpoint, turns, 5)


def test_chat_refuses_options_it_cannot_honour(capsys, checkpoint) -> None:
    for extra, message in ((["--prompt-file", "-"], "standard input carries the turns"),
                           (["--no-cache"], "drop --no-cache"), (["--num-beams", "3"], "drop --batch, --stream")):
        code = main(["generate", "--interactive", str(checkpoint), *extra])
        _, err = capsys.readouterr()
        assert code == 2 and message in err


def test_chat_with_an_opening_prompt(capsys, monkeypatch, checkpoint) -> None:
    """In-process (the subprocess test above covers the console script)."""
    turns = ["x = 1\n"]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("".join(turns).encode())))
    code = main(["chat", str(checkpoint), "--prompt", "import os\n", "--max-new-tokens", "12", "--ignore-eos"])
    out, err = capsys.readouterr()
    assert code == 0, err
    model = specformer.load(checkpoint).eval()
    history = BYTES.encode("import os\n" + turns[0])
    reply = BYTES.decode(generate(model, [history], max_new_tokens=12)[0][len(history):])
    assert out == "user: x = 1\nassistant: " + reply + ("" if reply.endswith("\n") else "\n")
