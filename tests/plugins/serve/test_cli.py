"""``specformer serve``: start-up errors exit 2 with one line; a real run answers, renders chat templates, stops on Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from specformer.cli.main import main

from .conftest import BYTES


def _error(capsys, *args: str) -> str:
    code = main(["serve", *map(str, args)])
    _, err = capsys.readouterr()
    assert code == 2, err
    return err


def test_start_up_errors_are_one_clear_line(capsys, checkpoint, tmp_path) -> None:
    assert "--port must be in 0..65535" in _error(capsys, checkpoint, "--port", "70000")
    assert "--max-batch must be at least 1" in _error(capsys, checkpoint, "--max-batch", "0")
    assert "--block-size must be at least 1" in _error(capsys, checkpoint, "--block-size", "0")
    assert "--threads must be a number" in _error(capsys, checkpoint, "--threads", "many")
    assert "--api-key is empty" in _error(capsys, checkpoint, "--api-key", " ")
    assert "--max-tokens-in-flight must be at least 1" in _error(capsys, checkpoint, "--max-tokens-in-flight", "0")
    for flag in ("--chat-template-max-chars", "--max-connections", "--max-body-bytes", "--max-messages"):
        assert f"{flag} must be at least 1, got 0" in _error(capsys, checkpoint, flag, "0")
    for flag in ("--chat-template-timeout", "--header-timeout", "--body-timeout"):
        assert f"{flag} must be a number of seconds above 0, got" in _error(capsys, checkpoint, flag, "0")
        assert f"{flag} must be a number of seconds above 0, got" in _error(capsys, checkpoint, flag, "inf")
    assert "neither a built-in template (chatml) nor a readable file" in _error(
        capsys, checkpoint, "--chat-template", tmp_path / "missing.jinja")
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}")
    assert "does not compile" in _error(capsys, checkpoint, "--chat-template", broken)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert f"cannot listen on 127.0.0.1:{port}" in _error(capsys, checkpoint, "--port", port)


@pytest.mark.slow
def test_a_real_run_answers_then_stops_on_ctrl_c(checkpoint, tmp_path) -> None:
    """A separate process, as a user runs it (several seconds: a fresh interpreter imports torch)."""
    template = tmp_path / "turns.jinja"
    template.write_text("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                        "{% if add_generation_prompt %}<assistant>{% endif %}")
    command = [sys.executable, "-m", "specformer.cli", "serve", str(checkpoint), "--port", "0", "--api-key", "k",
               "--chat-template", str(template), "--threads", "1"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        line = process.stderr.readline()
        url = re.search(r"on (http://\S+) \(", line).group(1)
        headers = {"Authorization": "Bearer k"}
        models = httpx.get(f"{url}/v1/models", headers=headers, timeout=30).json()
        assert models["data"][0]["id"] == Path(checkpoint).stem
        body = {"model": Path(checkpoint).stem, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
                "temperature": 0, "return_token_ids": True}
        choice = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=30).json()["choices"][0]
        assert choice["prompt_token_ids"] == BYTES.encode("<user>hi<assistant>")
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) in (0, 130)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stderr.close()


def test_the_checkpoints_own_chat_template_is_used(tmp_path) -> None:
    """An imported model keeps tokenizer_config.json in its header; its chat_template renders the messages."""
    from specformer_serve.chat_template import chat_renderer

    settings = {"chat_template": "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n"
                                 "{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}",
                "bos_token": "<s>"}
    template = chat_renderer(None, {"hf.tokenizer_config": json.dumps(settings)})
    assert template.where == "the checkpoint's chat template"
    assert template.render([{"role": "user", "content": "Hi"}]) == "<s>[user] Hi\n[assistant] "
    render = chat_renderer("chatml", {}).render
    assert render([{"role": "user", "content": "Hi"}]) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    render = chat_renderer(None, {}).render
    assert render([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]) == "system: S\nuser: U\nassistant:"


def test_another_checkpoints_template_is_read_as_generate_reads_it(tmp_path) -> None:
    """``--chat-template BASE.safetensors``: a full fine-tune is served with its base's template, as generate does."""
    import specformer
    from specformer_serve.chat_template import chat_renderer

    from .conftest import SPEC

    base = tmp_path / "base.safetensors"
    settings = {"chat_template": "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<bot>"}
    specformer.save(specformer.build(SPEC, seed=0), base, metadata={"hf.tokenizer_config": json.dumps(settings)})
    template = chat_renderer(str(base), {})
    assert template.where == str(base)
    assert template.render([{"role": "user", "content": "Hi"}]) == "<user>Hi<bot>"
    with pytest.raises(Exception, match="--chat-template: 'no/such' is neither a built-in template"):
        chat_renderer("no/such", {})


def test_a_template_refusing_the_messages_is_a_400(model) -> None:
    from specformer_serve.app import ServeConfig
    from specformer_serve.chat_template import renderer_for
    from specformer_serve.engine import Engine
    from specformer_serve.server import Server

    strict = renderer_for("{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system "
                          "messages') }}{% endif %}{{ m['content'] }}{% endfor %}")
    config = ServeConfig(model_id="tiny", tokenizer=BYTES, render_chat=strict, eos=frozenset())
    with Server(Engine(model, max_batch=2, num_blocks=32, block_size=4), config) as server:
        body = {"model": "tiny", "messages": [{"role": "system", "content": "x"}], "max_tokens": 2}
        r = httpx.post(f"{server.url}/v1/chat/completions", json=body)
        assert r.status_code == 400 and "no system messages" in r.json()["error"]["message"]
        assert r.json()["error"]["param"] == "messages"
        body["messages"][0]["role"] = "user"
        assert httpx.post(f"{server.url}/v1/chat/completions", json=body).status_code == 200


def test_without_the_serve_extra_the_command_says_how_to_install_it(capsys, checkpoint, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # what an environment without the extra looks like
    err = _error(capsys, checkpoint)
    assert "specformer serve needs uvicorn" in err and "pip install 'specformer[serve]'" in err
