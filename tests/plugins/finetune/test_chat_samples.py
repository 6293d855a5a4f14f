"""A chat run's samples are a conversation under its template, ended at the end of turn; its closing hint is
``specformer chat`` with the template the model file does not carry itself."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import specformer
from specformer.cli.main import main
from specformer.tokenizers.tokenizer import METADATA_KEY, ByteTokenizer
from specformer_finetune.training import ChatPrompting, chat_rows
from specformer_text.end_of_turn import turn_end
from specformer_train import train
from specformer_train.sampling import sample_text

from .conftest import TINY_MODEL, tiny_finetune_spec

BYTES = ByteTokenizer()
#: Room for a rendered ChatML conversation (about 70 bytes) and its reply.
MODEL = {**TINY_MODEL, "context_length": 128}
ADAPTER = {"kind": "lora", "rank": 4, "alpha": 8, "targets": ["blocks.*.mixer.*"]}


class _Replying(torch.nn.Module):
    """``model`` that answers ``reply`` (then ``x``) after the prompt; records the prompt it read."""

    def __init__(self, model: Any, reply: list[int]) -> None:
        super().__init__()
        self.inner, self.reply, self.at, self.read = model, reply, 0, []

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.inner, name)

    def forward(self, ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        logits = self.inner(ids, **kwargs).clone()
        if ids.shape[1] > 1:
            self.read, self.at = ids[0].tolist(), 0
        token = self.reply[self.at] if self.at < len(self.reply) else ord("x")
        self.at += 1
        logits[:, -1] = -1e4
        logits[:, -1, token] = 1e4
        return logits


def test_a_chat_sample_is_a_user_message_answered_up_to_the_end_of_turn() -> None:
    from specformer_text.chat_template import BUILTIN

    chat = ChatPrompting(source=BUILTIN["chatml"], tokens={}, option="--chat-template chatml",
                         turn_end=turn_end(BUILTIN["chatml"], tokenizer=BYTES))
    model = _Replying(specformer.build({"model": MODEL}, seed=0), BYTES.encode("4.<|im_end|>\n<|im_start|>"))
    text = sample_text(model, BYTES, prompt="what is 3 plus one?", max_new_tokens=40, temperature=1.0, top_k=None,
                       seed=0, device=torch.device("cpu"), chat=chat)
    assert text == "user: what is 3 plus one?\nassistant: 4."
    rendered = "<|im_start|>user\nwhat is 3 plus one?<|im_end|>\n<|im_start|>assistant\n"
    assert model.read == [BYTES.eot_id, *BYTES.encode(rendered)]  # a conversation opens after end-of-text, as in training
    # Generation stopped at the marker (checked every few tokens), not after max_new_tokens.
    assert model.at < 40


def test_a_chat_runs_samples_and_hint_use_its_template(tmp_path: Path, chat_file: Path, monkeypatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    spec = tiny_finetune_spec(chat_template="chatml", tokenizer="byte", sample_tokens=8,
                              sample_prompt="what is 2 plus one?", steps=3, eval_every=3)
    spec["model"] = dict(MODEL)
    run = tmp_path / "run"
    result = train(spec, data=str(chat_file), out_dir=str(run))
    out = capsys.readouterr().out
    assert "--- sample at step 3 ---\nuser: what is 2 plus one?\nassistant: " in out
    model = run / "model.safetensors"
    assert result.generate_command == f"specformer chat {model} --chat-template chatml --max-new-tokens 64"
    # The command works as printed (here with a conversation piped in).
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"what is 1 plus one?\n")))
    assert main(result.generate_command.split()[1:]) == 0
    assert capsys.readouterr().out.startswith("user: what is 1 plus one?\nassistant: ")


def _base_with_template(tmp_path: Path) -> Path:
    settings = {"chat_template": "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
                                 "{% if add_generation_prompt %}<|assistant|>{% endif %}"}
    path = tmp_path / "imported.safetensors"
    specformer.save(specformer.build({"model": TINY_MODEL}, seed=3), path,
                    metadata={METADATA_KEY: BYTES.to_json(), "hf.tokenizer_config": json.dumps(settings)})
    return path


@pytest.mark.parametrize("adapter", [True, False])
def test_the_hint_names_the_template_only_when_the_model_file_lacks_it(tmp_path: Path, chat_file: Path,
                                                                      adapter: bool) -> None:
    """An adapter checkpoint copies its base's header (template included); a full fine-tune's does not, so the
    hint reads the template from the base checkpoint."""
    base = _base_with_template(tmp_path)
    config = SimpleNamespace(data=str(chat_file), chat_template=None, tokenizer="byte", streaming=False, seed=0,
                             val_fraction=0.1, cache_dir=None, adapter=ADAPTER if adapter else None, init=str(base))
    prompting = chat_rows(config, BYTES, seq_len=32, metadata=specformer.checkpoint.save_load.read_metadata(base),
                          vocab_size=259).prompting
    assert prompting.turn_end.strings == ("<|end|>",)
    assert prompting.option == ("" if adapter else f"--chat-template {base.resolve()}")
    assert prompting.prompt("hi") == "<|user|>hi<|end|><|assistant|>"
