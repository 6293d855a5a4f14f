"""A chat reply ends at the template's end of turn: ``finish_reason: stop``, the marker not in the text.

The model is rigged: the real forward runs (so the paged cache is exercised), then the
last position's logits are replaced so that the token at position ``p`` is ``script[p - start]``.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import torch

from specformer.tokenizers.tokenizer import BPETokenizer
from specformer_serve.chat_template import chat_renderer
from specformer_serve.serve_command import run as serve_run

from .conftest import BYTES, MODEL_ID, make_server

MESSAGES = [{"role": "user", "content": "Hi"}]
CHATML_PROMPT = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


class Scripted:
    """``model``, but the token after position ``p`` is ``script[p + 1 - start]`` (``filler`` past the script)."""

    def __init__(self, model: Any, script: list[int], *, start: int, filler: int) -> None:
        self.model, self.script, self.start, self.filler = model, script, start, filler

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def __call__(self, ids: torch.Tensor, *, positions: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        logits = self.model(ids, positions=positions, **kwargs).clone()  # (B, T', V)
        for row, position in enumerate(positions[:, -1].tolist()):
            at = position + 1 - self.start
            token = self.script[at] if 0 <= at < len(self.script) else self.filler
            logits[row, -1] = -1e4
            logits[row, -1, token] = 1e4
        return logits


def _post(server: Any, body: dict[str, Any], route: str = "chat/completions") -> dict[str, Any]:
    response = httpx.post(f"{server.url}/v1/{route}", json={"model": MODEL_ID, **body}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def _stream(server: Any, body: dict[str, Any]) -> list[dict[str, Any]]:
    chunks = []
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json={"model": MODEL_ID, "stream": True, **body},
                      timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: "):]))
    return chunks


def _streamed(chunks: list[dict[str, Any]], index: int) -> tuple[list[str], str | None]:
    pieces = [c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"][0]["index"] == index]
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"][0]["index"] == index]
    return [p for p in pieces if p], finish[-1]


def test_chatml_with_the_byte_tokenizer_stops_at_the_marker_spelled_in_bytes(model) -> None:
    """No byte-tokenizer token is <|im_end|>: the text is matched, cut, and held back while streaming."""
    template = chat_renderer("chatml", {})
    end = template.turn_end(BYTES, {})
    assert end.strings == ("<|im_end|>",) and not end.ids - {BYTES.eot_id}
    script = BYTES.encode("Hello <there><|im_end|>\nand on and on")
    rigged = Scripted(model, script, start=len(BYTES.encode(CHATML_PROMPT)), filler=ord("x"))
    with make_server(rigged, config={"render_chat": template.render, "turn_end": end}) as server:
        body = {"messages": MESSAGES, "max_tokens": 40, "temperature": 0, "n": 2}
        reply = _post(server, body)
        for choice in reply["choices"]:
            assert choice["message"]["content"] == "Hello <there>"
            assert choice["finish_reason"] == "stop"
        chunks = _stream(server, body)
        for index in (0, 1):
            pieces, finish = _streamed(chunks, index)
            assert "".join(pieces) == "Hello <there>" and finish == "stop"
            assert not any("<|" in piece for piece in pieces)  # a partial marker was never sent
        # Completions have no template: they keep today's behaviour (eos only), the marker is text.
        completion = _post(server, {"prompt": CHATML_PROMPT, "max_tokens": len(script), "temperature": 0},
                           "completions")["choices"][0]
        assert completion["text"].startswith("Hello <there><|im_end|>\n") and completion["finish_reason"] == "length"


def _bpe_with_im_end() -> BPETokenizer:
    """A tiny byte-level BPE whose <|im_end|> is one added token (added as text, so decode would show it)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    inner = Tokenizer(models.BPE())
    inner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    inner.decoder = decoders.ByteLevel()
    inner.train_from_iterator(["hello there, how are you? " * 20],
                              trainers.BpeTrainer(vocab_size=120, special_tokens=["<|endoftext|>"]))
    inner.add_tokens(["<|im_start|>", "<|im_end|>"])
    return BPETokenizer(inner)


def test_chatml_with_a_bpe_tokenizer_stops_on_the_im_end_id(model) -> None:
    bpe = _bpe_with_im_end()
    im_end = bpe.inner.token_to_id("<|im_end|>")
    assert bpe.decode([im_end]) == "<|im_end|>"  # what the reply would show if the id were not held out
    template = chat_renderer("chatml", {})
    end = template.turn_end(bpe, {})
    assert end.ids == {im_end} and end.strings == ()
    reply_ids = bpe.encode("hello there")
    script = [*reply_ids, im_end, *bpe.encode(" how are you")]
    rigged = Scripted(model, script, start=len(bpe.encode(CHATML_PROMPT)), filler=bpe.encode("o")[0])
    with make_server(rigged, config={"render_chat": template.render, "turn_end": end, "tokenizer": bpe}) as server:
        body = {"messages": MESSAGES, "max_tokens": 30, "temperature": 0}
        reply = _post(server, body)
        assert reply["choices"][0]["message"]["content"] == "hello there"
        assert reply["choices"][0]["finish_reason"] == "stop"
        assert reply["usage"]["completion_tokens"] == len(reply_ids) + 1  # it ended on the marker, not at length
        pieces, finish = _streamed(_stream(server, body), 0)
        assert "".join(pieces) == "hello there" and finish == "stop"


def test_generation_config_eos_ids_end_a_chat_reply(model) -> None:
    """An imported model's generation_config.json eos_token_id list (Llama 3 names two) ends the reply on either."""
    metadata = {"hf.generation_config": json.dumps({"eos_token_id": [ord("#"), ord("%")]})}
    template = chat_renderer(None, metadata)  # the plain template: no marker of its own
    end = template.turn_end(BYTES, metadata)
    assert end.ids == {ord("#"), ord("%")} and end.strings == ()
    prompt = template.render(MESSAGES)
    rigged = Scripted(model, BYTES.encode("ok%more"), start=len(BYTES.encode(prompt)), filler=ord("x"))
    with make_server(rigged, config={"render_chat": template.render, "turn_end": end}) as server:
        reply = _post(server, {"messages": MESSAGES, "max_tokens": 20, "temperature": 0})
        assert reply["choices"][0]["message"]["content"] == "ok"
        assert reply["choices"][0]["finish_reason"] == "stop"


class _Started(Exception):
    pass


@pytest.mark.parametrize("ignore_eos", [False, True])
def test_the_command_gives_the_server_its_templates_turn_end(checkpoint, monkeypatch, ignore_eos: bool) -> None:
    """``specformer serve --chat-template chatml`` wires the turn end in; ``--ignore-eos`` leaves it out."""
    seen: dict[str, Any] = {}

    class FakeServer:
        def __init__(self, engine: Any, config: Any, **kwargs: Any) -> None:
            seen["config"] = config
            raise _Started

    monkeypatch.setattr("specformer_serve.server.Server", FakeServer)
    args = _serve_args(checkpoint, ["--chat-template", "chatml", *(["--ignore-eos"] if ignore_eos else [])])
    with pytest.raises(_Started):
        serve_run(args)
    end = seen["config"].turn_end
    assert end.strings == (() if ignore_eos else ("<|im_end|>",))


def _serve_args(checkpoint: Any, extra: list[str]) -> Any:
    import argparse

    from specformer_serve.cli import configure

    parser = argparse.ArgumentParser()
    configure(parser)
    return parser.parse_args([str(checkpoint), "--port", "0", "--threads", "1", *extra])
