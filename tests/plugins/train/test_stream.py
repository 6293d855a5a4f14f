"""Streaming rows: lazy reading, one pass per epoch in a seeded order, exact resume from a JSON position."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from specformer.errors import UserError
from specformer.tokenizers.tokenizer import ByteTokenizer
from specformer_train import train
from specformer_train.checkpointing import latest_checkpoint
from specformer_text.corpus import find_corpus
from specformer_train.metrics import read_metrics
from specformer_train.stream import StreamRows

from .conftest import tiny_train_spec

EOT = 256
SEQ = 16


def _many_files(folder: Path, n_files: int = 9) -> dict[str, list[str]]:
    """Files of several kinds, each with distinct documents; returns each file's documents by name."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    docs: dict[str, list[str]] = {}
    for f in range(n_files):
        texts = [f"<{f}.{d}>" + "x" * int(rng.integers(0, 30)) for d in range(int(rng.integers(1, 6)))]
        if f % 3 == 0:
            name = f"f{f:02d}.txt"
            texts = [texts[0]]
            (folder / name).write_text(texts[0])
        else:
            name = f"f{f:02d}.jsonl"
            (folder / name).write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        docs[name] = texts
    return docs


def _stream_text(rows: np.ndarray) -> list[int]:
    """The token stream the rows were cut from (row n starts at n * SEQ and overlaps the next by one)."""
    return [t for row in rows for t in row[:SEQ].tolist()] + rows[-1][SEQ:].tolist()


def _documents_of(tokens: list[int]) -> list[str]:
    out, current = [], []
    for t in tokens:
        if t == EOT:
            out.append(bytes(current).decode())
            current = []
        else:
            current.append(t)
    return out


def test_each_epoch_reads_every_file_once_in_a_seeded_order(tmp_path: Path) -> None:
    docs = _many_files(tmp_path / "c")
    corpus = find_corpus(str(tmp_path / "c"))
    stream = StreamRows(corpus, ByteTokenizer(), seq_len=SEQ, seed=7)
    names = [p.name for p in corpus.files]
    per_epoch = sum(len(d.encode()) + 1 for texts in docs.values() for d in texts)
    rows = stream.rows(0, (3 * per_epoch) // SEQ)  # a little under three epochs
    got = _documents_of(_stream_text(rows))
    expected = []
    for epoch in range(3):
        order = stream.order(epoch)
        assert sorted(order) == list(range(len(names)))  # every file once
        expected += [d for i in order for d in docs[names[i]]]
    assert got == expected[: len(got)] and len(got) > 2 * sum(map(len, docs.values()))
    assert stream.order(0) != stream.order(1)  # each epoch its own order
    again = StreamRows(find_corpus(str(tmp_path / "c")), ByteTokenizer(), seq_len=SEQ, seed=7)
    assert np.array_equal(again.rows(0, len(rows)), rows)  # deterministic
    other = StreamRows(find_corpus(str(tmp_path / "c")), ByteTokenizer(), seq_len=SEQ, seed=8)
    assert not np.array_equal(other.rows(0, len(rows)), rows)


@pytest.mark.parametrize("stop", [1, 5, 13, 40])
def test_resuming_from_a_saved_position_reads_the_same_rows(tmp_path: Path, stop: int) -> None:
    _many_files(tmp_path / "c")
    corpus = find_corpus(str(tmp_path / "c"))
    whole = StreamRows(corpus, ByteTokenizer(), seq_len=SEQ, seed=1).rows(0, 60)  # past an epoch boundary
    first = StreamRows(corpus, ByteTokenizer(), seq_len=SEQ, seed=1)
    first.rows(0, stop - 1)  # a reader that stopped short of the checkpoint (another process' rows)
    position = json.loads(json.dumps(first.position(stop)))  # what trainer.json holds
    resumed = StreamRows(find_corpus(str(tmp_path / "c")), ByteTokenizer(), seq_len=SEQ, seed=1)
    resumed.restore(position, sequences=stop)
    assert np.array_equal(resumed.rows(stop, 60 - stop), whole[stop:])
    # Without a position (a checkpoint that did not stream) it reads up to the row count: same rows.
    fallback = StreamRows(corpus, ByteTokenizer(), seq_len=SEQ, seed=1)
    fallback.restore(None, sequences=stop)
    assert np.array_equal(fallback.rows(stop, 5), whole[stop : stop + 5])


def test_a_position_can_fall_inside_a_document(tmp_path: Path) -> None:
    (tmp_path / "one.txt").write_text("a" * 100)
    (tmp_path / "two.txt").write_text("b" * 100)
    stream = StreamRows(find_corpus(str(tmp_path)), ByteTokenizer(), seq_len=SEQ, seed=0)
    stream.rows(0, 3)
    position = stream.position(3)
    assert position["offset"] == 3 * SEQ and position["document"] == 0 and position["epoch"] == 0


def test_validation_holds_out_the_first_documents_and_training_never_reads_them(tmp_path: Path) -> None:
    docs = _many_files(tmp_path / "c")
    corpus = find_corpus(str(tmp_path / "c"))
    stream = StreamRows(corpus, ByteTokenizer(), seq_len=SEQ, seed=3, holdout_rows=2)
    val = stream.val_tokens.tolist()
    all_docs = [d for name in sorted(docs) for d in docs[name]]
    assert len(val) == 2 * SEQ + 1  # exactly the rows asked for
    n_held = val.count(EOT) + (val[-1] != EOT)  # the last held-out document may be cut short
    expected_val = [t for d in all_docs[:n_held] for t in [*d.encode(), EOT]][: len(val)]
    assert val == expected_val  # the first documents in sorted file order
    per_epoch = sum(len(d.encode()) + 1 for d in all_docs[n_held:])
    trained = _documents_of(_stream_text(stream.rows(0, (2 * per_epoch) // SEQ)))
    assert set(trained) == set(all_docs[n_held:])  # the rest, and none held out


def test_a_corpus_no_longer_than_the_validation_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "small.txt").write_text("tiny")
    with pytest.raises(UserError, match=r"no longer than the 33 tokens held out for validation"):
        StreamRows(find_corpus(str(tmp_path / "small.txt")), ByteTokenizer(), seq_len=SEQ, seed=0, holdout_rows=2)


def test_a_stream_reads_forward_only(tmp_path: Path) -> None:
    (tmp_path / "one.txt").write_text("a" * 100)
    stream = StreamRows(find_corpus(str(tmp_path)), ByteTokenizer(), seq_len=SEQ, seed=0)
    stream.rows(0, 3)
    with pytest.raises(ValueError, match="forward only"):
        stream.rows(1, 1)


# -- in training ------------------------------------------------------------------------


def _run(out: Path, data: Path, **settings):
    result = train(tiny_train_spec(data=str(data), out_dir=str(out), streaming=True, eval_steps=1, **settings))
    return result, read_metrics(out / "metrics.jsonl")


def test_streamed_training_resumes_exactly(tmp_path: Path) -> None:
    import shutil

    _many_files(tmp_path / "c", n_files=30)
    _, whole = _run(tmp_path / "whole", tmp_path / "c", steps=8, save_every=4, eval_every=4)
    # A second run directory holding only the step-4 checkpoint, as if the run had died after it.
    cut = tmp_path / "cut" / "checkpoints"
    cut.mkdir(parents=True)
    shutil.copytree(tmp_path / "whole" / "checkpoints" / "step-0000004", cut / "step-0000004")
    (cut / "latest").write_text("step-0000004")
    (tmp_path / "cut" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in whole if r["step"] <= 4))
    state = json.loads((cut / "step-0000004" / "trainer.json").read_text())
    assert state["extra"]["stream"]["sequences"] == 16 and state["data"]["fingerprint"].startswith("files:")
    result = train(tiny_train_spec(data=str(tmp_path / "c"), out_dir=str(tmp_path / "cut"), streaming=True,
                                   eval_steps=1, steps=8, save_every=4, eval_every=4), resume=True)
    resumed = read_metrics(tmp_path / "cut" / "metrics.jsonl")
    assert result.step == 8
    assert [r["loss"] for r in resumed if r["kind"] == "train"] == [r["loss"] for r in whole if r["kind"] == "train"]
    assert [r["val_loss"] for r in resumed if r["kind"] == "eval"] == [r["val_loss"] for r in whole if r["kind"] == "eval"]


def test_switching_streaming_on_at_resume_counts_as_other_data(tmp_path: Path) -> None:
    _many_files(tmp_path / "c", n_files=30)
    train(tiny_train_spec(data=str(tmp_path / "c"), out_dir=str(tmp_path / "r"), steps=2, eval_every=0, eval_steps=1))
    with pytest.raises(UserError, match="the data differs from what the run was trained on"):
        train(tiny_train_spec(data=str(tmp_path / "c"), out_dir=str(tmp_path / "r"), steps=4, eval_every=0,
                              eval_steps=1, streaming=True), resume=True)


def test_streaming_needs_a_number_of_evaluation_batches(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="streaming holds out eval_steps x batch_size rows"):
        train(tiny_train_spec(out_dir=str(tmp_path / "r"), streaming=True, eval_steps=None))


def test_a_position_in_other_files_starts_the_new_corpus_at_its_beginning(tmp_path: Path) -> None:
    _many_files(tmp_path / "a")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "new.txt").write_text("n" * 200)
    old = StreamRows(find_corpus(str(tmp_path / "a")), ByteTokenizer(), seq_len=SEQ, seed=1)
    old.rows(0, 7)
    position = old.position(7)
    new = StreamRows(find_corpus(str(tmp_path / "b")), ByteTokenizer(), seq_len=SEQ, seed=1)
    new.restore(position, sequences=7)  # --resume --new-data: the row count goes on, the new data from its start
    fresh = StreamRows(find_corpus(str(tmp_path / "b")), ByteTokenizer(), seq_len=SEQ, seed=1)
    assert np.array_equal(new.rows(7, 3), fresh.rows(0, 3))


def test_streaming_reads_lazily_and_writes_no_token_cache(tmp_path: Path, _private_cache: Path) -> None:
    folder = tmp_path / "c"
    folder.mkdir()
    (folder / "a.jsonl").write_text("".join(json.dumps({"text": "y" * 50}) + "\n" for _ in range(20)) + "{broken\n")
    stream = StreamRows(find_corpus(str(folder)), ByteTokenizer(), seq_len=SEQ, seed=0)
    assert stream.rows(0, 10).shape == (10, SEQ + 1)  # the broken last line is not read yet
    with pytest.raises(UserError, match=r"a.jsonl:21: not valid JSON"):
        stream.rows(10, 100)
    _many_files(tmp_path / "d", n_files=30)
    train(tiny_train_spec(data=str(tmp_path / "d"), out_dir=str(tmp_path / "r"), streaming=True, eval_steps=1, steps=2,
                          eval_every=0))
    assert not (_private_cache / "tokens").exists()
