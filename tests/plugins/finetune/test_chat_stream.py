"""Chat data with ``train.streaming``: streamed rows carry the in-memory path's tokens and loss mask, and a run
resumed mid-stream reads exactly the rows the uninterrupted one would have."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import specformer
from specformer.tokenizers.tokenizer import ByteTokenizer
from specformer_finetune.chat_data import encode_file
from specformer_finetune.chat_stream import ChatStreamRows
from specformer_text.chat_template import resolve_template
from specformer_train import train
from specformer_text.corpus import find_corpus

from .conftest import tiny_finetune_spec

SEQ = 32


@pytest.fixture
def mixed_file(tmp_path: Path) -> Path:
    """Two-turn conversations and prompt/completion pairs, a blank line among them (not a record)."""
    path = tmp_path / "mixed.jsonl"
    lines = []
    for i in range(40):
        if i % 3 == 2:
            counted = " ".join(map(str, range(i % 4 + 1)))
            lines.append(json.dumps({"prompt": f"count to {i % 4}:", "completion": " " + counted}))
        else:
            lines.append(json.dumps({"messages": [
                {"role": "system", "content": "be brief"}, {"role": "user", "content": f"what is {i} plus one?"},
                {"role": "assistant", "content": f"{i + 1}."}, {"role": "user", "content": "and minus one?"},
                {"role": "assistant", "content": f"{i - 1}."}]}))
        if i == 7:
            lines.append("")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _stream(path: Path, template: str | None, **kwargs: int) -> ChatStreamRows:
    return ChatStreamRows(find_corpus(str(path)), ByteTokenizer(), resolve_template(template, None), seq_len=SEQ,
                          seed=0, **kwargs)


@pytest.mark.parametrize("template", ["chatml", None])
def test_streamed_rows_carry_the_in_memory_tokens_and_masks(tmp_path: Path, chat_file: Path, mixed_file: Path,
                                                            template: str | None) -> None:
    path = mixed_file if template else tmp_path / "pairs.jsonl"
    if template is None:  # prompt/completion without a template: the end-of-text after a completion counts
        path.write_text("".join(json.dumps({"prompt": f"q{i}?", "completion": f" a{i}."}) + "\n" for i in range(30)))
    memory = encode_file(str(path), ByteTokenizer(), resolve_template(template, None))
    # The in-memory corpus opens with an end-of-text; the stream is the conversations, each followed by one.
    one_epoch_tokens, one_epoch_mask = memory.tokens[1:].astype(np.int64), memory.mask[1:]
    assert one_epoch_mask.any() and not one_epoch_mask.all()
    tokens, mask = np.tile(one_epoch_tokens, 3), np.tile(one_epoch_mask, 3)  # one file: every epoch alike

    stream = _stream(path, template)
    n_rows = 2 * len(one_epoch_tokens) // SEQ  # two epochs and more
    for first in range(0, n_rows, 3):
        rows = stream.rows(first, 3)
        got_mask = stream.loss_mask(first, 3)
        assert rows.shape == got_mask.shape == (3, SEQ + 1) and rows.dtype == np.int64 and got_mask.dtype == bool
        for i in range(3):
            start = (first + i) * SEQ
            np.testing.assert_array_equal(rows[i], tokens[start:start + SEQ + 1])
            np.testing.assert_array_equal(got_mask[i], mask[start:start + SEQ + 1])


def test_the_held_out_rows_are_the_first_conversations_with_their_mask(mixed_file: Path) -> None:
    memory = encode_file(str(mixed_file), ByteTokenizer(), resolve_template("chatml", None))
    stream = _stream(mixed_file, "chatml", holdout_rows=2)
    np.testing.assert_array_equal(stream.val_tokens, memory.tokens[1:2 * SEQ + 2])
    np.testing.assert_array_equal(stream.val_mask, memory.mask[1:2 * SEQ + 2])
    # Training starts at the first conversation not held out (whole or in part): never a validation token.
    first = stream.rows(0, 1)[0]
    held_ends = np.flatnonzero(memory.tokens[1:] == ByteTokenizer().eot_id)
    next_start = 1 + held_ends[np.searchsorted(held_ends, 2 * SEQ)] + 1
    np.testing.assert_array_equal(first, memory.tokens[next_start:next_start + SEQ + 1])
    np.testing.assert_array_equal(stream.loss_mask(0, 1)[0], memory.mask[next_start:next_start + SEQ + 1])


def test_a_restored_stream_reads_the_same_rows_and_masks(mixed_file: Path) -> None:
    whole = _stream(mixed_file, "chatml", holdout_rows=1)
    whole.rows(0, 5)
    position = json.loads(json.dumps(whole.position(5)))  # as trainer.json stores it
    assert position["offset"] > 0  # mid-conversation: the offset matters
    expected = [(whole.rows(first, 2), whole.loss_mask(first, 2)) for first in range(5, 45, 2)]

    resumed = _stream(mixed_file, "chatml", holdout_rows=1)
    resumed.restore(position, sequences=5)
    for first, (rows, mask) in zip(range(5, 45, 2), expected):
        np.testing.assert_array_equal(resumed.rows(first, 2), rows)
        np.testing.assert_array_equal(resumed.loss_mask(first, 2), mask)
    with pytest.raises(ValueError, match="rows just read"):
        resumed.loss_mask(3, 2)


def test_streamed_chat_run_resumes_like_an_uninterrupted_one(tmp_path: Path, base_ckpt: Path,
                                                             chat_file: Path) -> None:
    spec = tiny_finetune_spec(adapter={"kind": "lora", "rank": 4, "alpha": 8}, streaming=True, chat_template="chatml")
    whole = train(spec, data=str(chat_file), out_dir=str(tmp_path / "a"), init=str(base_ckpt))
    saved = json.loads((tmp_path / "a" / "checkpoints" / "step-0000003" / "trainer.json").read_text())
    assert saved["extra"]["stream"]["sequences"] == 12  # the stream's place is in the checkpoint
    shutil.copytree(tmp_path / "a" / "checkpoints" / "step-0000003", tmp_path / "b" / "checkpoints" / "step-0000003")
    (tmp_path / "b" / "checkpoints" / "latest").write_text("step-0000003")
    resumed = train(spec, data=str(chat_file), out_dir=str(tmp_path / "b"), init=str(base_ckpt), resume=True)
    assert resumed.loss == whole.loss and resumed.val_loss == whole.val_loss
    a = specformer.load(whole.model_path).state_dict()
    b = specformer.load(resumed.model_path).state_dict()
    for name in a:
        assert torch.equal(a[name], b[name]), name
