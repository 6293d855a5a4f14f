"""``generate --chat-template`` and ``chat`` with a template: the prompt is rendered as a conversation, the
reply ends at the template's end of turn (not printed), a chat feeds only each turn's new tokens, and a
chat through a pipe writes a transcript.

The model is rigged: its real forward runs (the cache is filled as usual), then the last
position's logits are replaced so that it says ``replies[k]``, token by token, after the
k-th multi-token forward (a prompt or a turn).
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import specformer
from specformer.cli.main import main
from specformer.tokenizers.tokenizer import METADATA_KEY, BPETokenizer, ByteTokenizer

from .specs_for_tests import tiny_with

BYTES = ByteTokenizer()
CHATML = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
#: A template in Gemma's shape, as an imported checkpoint keeps it in its header.
GEMMA_LIKE = ("{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n"
              "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


class Scripted(torch.nn.Module):
    """``model`` that says ``replies[k]`` after its k-th multi-token forward, then ``filler``; records what it read."""

    def __init__(self, model: Any, replies: list[list[int]], *, filler: int) -> None:
        super().__init__()
        self.model, self.replies, self.filler = model, replies, filler
        self.reads: list[tuple[list[int], int]] = []  # (ids, first position) of each multi-token forward
        self.turn, self.at = -1, 0

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.model, name)

    def forward(self, ids: torch.Tensor, *, positions: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        logits = self.model(ids, positions=positions, **kwargs).clone()  # (1, T', V)
        if ids.shape[1] > 1:
            self.reads.append((ids[0].tolist(), int(positions[0, 0])))
            self.turn, self.at = self.turn + 1, 0
        reply = self.replies[self.turn] if self.turn < len(self.replies) else []
        token = reply[self.at] if self.at < len(reply) else self.filler
        self.at += 1
        logits[:, -1] = -1e4
        logits[:, -1, token] = 1e4
        return logits


def _checkpoint(path: Path, metadata: dict[str, str] | None = None, *, context: int = 256) -> Path:
    model = specformer.build(tiny_with(vocab_size=259, context_length=context), seed=0)
    specformer.save(model, path, metadata=metadata)
    return path


@pytest.fixture
def rig(monkeypatch) -> Any:
    """``rig(replies)``: the next ``specformer.load`` returns the scripted model, which the test then inspects."""
    def install(replies: list[str | list[int]], *, filler: int = ord("x"), tokenizer: Any = BYTES) -> Scripted:
        real = specformer.load
        scripted: dict[str, Scripted] = {}

        def load(path: Any, **kwargs: Any) -> Scripted:
            ids = [tokenizer.encode(r) if isinstance(r, str) else r for r in replies]
            scripted["model"] = Scripted(real(path, **kwargs), ids, filler=filler)
            return scripted["model"]

        monkeypatch.setattr(specformer, "load", load)
        return scripted

    return install


def _run(capsys, monkeypatch, *args: Any, stdin: str | None = None) -> tuple[int, str, str]:
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode())))
    code = main([*map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("stream", [False, True])
def test_generate_renders_the_prompt_as_a_user_message_and_stops_at_im_end(capsys, monkeypatch, tmp_path, rig,
                                                                          stream: bool) -> None:
    ckpt = _checkpoint(tmp_path / "m.safetensors")
    scripted = rig(["Hello <you><|im_end|>\nmore"])
    code, out, err = _run(capsys, monkeypatch, "generate", ckpt, "--chat-template", "chatml", "--prompt", "Hi",
                          "--max-new-tokens", "40", *(["--stream"] if stream else []))
    assert code == 0, err
    assert out == "Hello <you>\n"  # the reply alone, cut before the marker
    ids, start = scripted["model"].reads[0]
    assert ids == BYTES.encode(CHATML.format("Hi")) and start == 0
    # The run ended at the marker, not at --max-new-tokens.
    assert err.startswith(f"{len(BYTES.encode('Hello <you><|im_end|>'))} tokens in")


def test_the_checkpoints_own_template_is_the_default_and_no_chat_template_turns_it_off(capsys, monkeypatch, tmp_path,
                                                                                       rig) -> None:
    settings = {"chat_template": GEMMA_LIKE, "eos_token": "<eos>"}
    ckpt = _checkpoint(tmp_path / "m.safetensors", {"hf.tokenizer_config": json.dumps(settings)})
    scripted = rig(["Fine.<end_of_turn>\nxx"])
    code, out, err = _run(capsys, monkeypatch, "generate", ckpt, "--prompt", "How?", "--max-new-tokens", "30")
    assert code == 0, err
    assert out == "Fine.\n"
    assert scripted["model"].reads[0][0] == BYTES.encode("<start_of_turn>user\nHow?<end_of_turn>\n<start_of_turn>model\n")
    # Another checkpoint's own template (a full fine-tune's base, as a chat run's hint names it).
    plain = _checkpoint(tmp_path / "plain.safetensors")
    rig(["Fine.<end_of_turn>\nxx"])
    code, out, err = _run(capsys, monkeypatch, "generate", plain, "--chat-template", ckpt, "--prompt", "How?",
                          "--max-new-tokens", "30")
    assert code == 0 and out == "Fine.\n", err
    code, out, err = _run(capsys, monkeypatch, "generate", ckpt, "--chat-template", plain, "--prompt", "How?")
    assert code == 2 and "has no chat template in its header" in err, err
    scripted = rig(["Fine.<end_of_turn>\nxx"])
    code, out, err = _run(capsys, monkeypatch, "generate", ckpt, "--prompt", "How?", "--max-new-tokens", "20",
                          "--no-chat-template")
    assert code == 0, err
    assert out == "How?Fine.<end_of_turn>\nx\n"  # plain text: the prompt continued, no end of turn
    assert scripted["model"].reads[0][0] == BYTES.encode("How?")


def test_a_bpe_tokenizer_with_an_im_end_token_stops_on_its_id(capsys, monkeypatch, tmp_path, rig) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    inner = Tokenizer(models.BPE())
    inner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    inner.decoder = decoders.ByteLevel()
    inner.train_from_iterator(["hello there, how are you? " * 20],
                              trainers.BpeTrainer(vocab_size=120, special_tokens=["<|endoftext|>"]))
    inner.add_tokens(["<|im_start|>", "<|im_end|>"])  # as text: decode would show them
    bpe = BPETokenizer(inner)
    im_end = inner.token_to_id("<|im_end|>")
    ckpt = _checkpoint(tmp_path / "m.safetensors", {METADATA_KEY: bpe.to_json()})
    reply = bpe.encode("hello there")
    rig([[*reply, im_end, *bpe.encode(" how")]], filler=bpe.encode("o")[0], tokenizer=bpe)
    code, out, err = _run(capsys, monkeypatch, "generate", ckpt, "--chat-template", "chatml", "--prompt", "hi",
                          "--max-new-tokens", "20")
    assert code == 0, err
    assert out == "hello there\n"
    assert err.startswith(f"{len(reply) + 1} tokens in")


def test_a_template_failure_is_one_line_and_exit_2(capsys, monkeypatch, tmp_path) -> None:
    ckpt = _checkpoint(tmp_path / "m.safetensors")
    refusing = tmp_path / "refusing.jinja"
    refusing.write_text("{{ raise_exception('only system messages here') }}")
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}")
    for extra, message in ((["--chat-template", refusing], "only system messages here"),
                           (["--chat-template", broken], "does not compile"),
                           (["--chat-template", tmp_path / "missing"], "neither a built-in template (chatml)"),
                           (["--chat-template", "chatml", "--ids"], "--ids gives token ids"),
                           (["--chat-template", "chatml", "--no-chat-template"], "contradict")):
        prompt = ["--prompt", "1 2"] if "--ids" in extra else ["--prompt", "Hi"]
        code, out, err = _run(capsys, monkeypatch, "generate", ckpt, *prompt, *extra)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    code, _, err = _run(capsys, monkeypatch, "chat", ckpt, "--chat-template", refusing, stdin="Hi\n")
    assert code == 2 and "only system messages here" in err and len(err.strip().splitlines()) == 1, err


def test_a_piped_chat_with_a_template_is_a_transcript_and_feeds_only_each_turns_new_tokens(capsys, monkeypatch,
                                                                                          tmp_path, rig) -> None:
    ckpt = _checkpoint(tmp_path / "m.safetensors")
    scripted = rig(["Hello!<|im_end|>\nzz", "Sure.<|im_end|>"])
    code, out, err = _run(capsys, monkeypatch, "chat", ckpt, "--chat-template", "chatml", "--prompt", "Be brief.",
                          "--max-new-tokens", "30", stdin="Hi\nMore?\n")
    assert code == 0, err
    assert out == "user: Hi\nassistant: Hello!\nuser: More?\nassistant: Sure.\n"
    (first, at0), (second, at1) = scripted["model"].reads
    system = "<|im_start|>system\nBe brief.<|im_end|>\n"
    assert first == BYTES.encode(system + CHATML.format("Hi")) and at0 == 0
    # Turn two: the reply's last token (drawn, not yet read) and the new user turn, after everything cached.
    assert BYTES.decode(second) == ">\n" + CHATML.format("More?")
    assert at1 == len(first) + len(BYTES.encode("Hello!<|im_end|>")) - 1


def test_a_template_that_rewrites_earlier_turns_reads_the_conversation_again(capsys, monkeypatch, tmp_path,
                                                                           rig) -> None:
    """A rendering that does not begin with what the session holds (this one shows the last message only)."""
    ckpt = _checkpoint(tmp_path / "m.safetensors")
    last_only = tmp_path / "last.jinja"
    last_only.write_text("[{{ messages[-1]['content'] }}]<|im_end|>{% if add_generation_prompt %}>{% endif %}")
    scripted = rig(["a<|im_end|>", "b<|im_end|>"])
    code, out, err = _run(capsys, monkeypatch, "chat", ckpt, "--chat-template", last_only, "--max-new-tokens", "20",
                          stdin="one\ntwo\n")
    assert code == 0, err
    assert out == "user: one\nassistant: a\nuser: two\nassistant: b\n"
    (_, at0), (second, at1) = scripted["model"].reads
    assert BYTES.decode(second) == "[two]<|im_end|>>" and at1 == 0


def test_when_the_conversation_outgrows_the_context_the_oldest_turns_go(capsys, monkeypatch, tmp_path, rig) -> None:
    """The system message stays; the first exchange is dropped and the rest is read again from position 0."""
    ckpt = _checkpoint(tmp_path / "m.safetensors", context=128)
    scripted = rig(["Hello!<|im_end|>", "Sure.<|im_end|>"])
    code, out, err = _run(capsys, monkeypatch, "chat", ckpt, "--chat-template", "chatml", "--prompt", "Be brief.",
                          "--max-new-tokens", "30", stdin="Hi\nMore?\n")
    assert code == 0, err
    assert out == "user: Hi\nassistant: Hello!\nuser: More?\nassistant: Sure.\n"
    assert "the oldest turns were dropped" in err
    second, at = scripted["model"].reads[1]
    assert BYTES.decode(second) == "<|im_start|>system\nBe brief.<|im_end|>\n" + CHATML.format("More?") and at == 0
