"""The tokenized-corpus cache: documents separated by end-of-text, memory-mapped, reused, invalidated."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from specformer.errors import UserError
from specformer.tokenizers.tokenizer import ByteTokenizer
from specformer_text import cache as cache_module
from specformer_text.cache import tokenize_corpus
from specformer_text.corpus import find_corpus
from specformer_text.tokenization import make_tokenizer


def test_documents_are_concatenated_with_eot_after_each(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("hi")
    (tmp_path / "b.txt").write_text("é!")
    tokens = tokenize_corpus(find_corpus(str(tmp_path)), ByteTokenizer())
    assert isinstance(tokens, np.memmap) and tokens.dtype == np.uint16
    assert tokens.tolist() == [104, 105, 256, 0xC3, 0xA9, 33, 256]


def test_bpe_ids_match_the_tokenizer(corpus_dir: Path) -> None:
    corpus = find_corpus(str(corpus_dir))
    bpe = make_tokenizer("bpe", vocab_size=300, corpus=corpus)
    tokens = tokenize_corpus(corpus, bpe)
    expected = []
    for doc in corpus.documents():
        expected += bpe.encode(doc) + [bpe.eot_id]
    assert tokens.tolist() == expected


def test_second_run_reads_the_cache_and_a_change_invalidates_it(corpus_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    corpus = find_corpus(str(corpus_dir))
    first = tokenize_corpus(corpus, ByteTokenizer())
    calls = []
    original = cache_module.encoded_documents
    monkeypatch.setattr(cache_module, "encoded_documents", lambda *a, **k: calls.append(1) or original(*a, **k))
    again = tokenize_corpus(find_corpus(str(corpus_dir)), ByteTokenizer())
    assert calls == [] and np.array_equal(first, again)
    path = corpus_dir / "doc1.txt"
    path.write_text(path.read_text() + "one more line\n")
    changed = tokenize_corpus(find_corpus(str(corpus_dir)), ByteTokenizer())
    assert len(calls) == 1 and len(changed) == len(first) + len("one more line\n")


def test_an_incomplete_entry_is_not_used(corpus_dir: Path, _private_cache: Path) -> None:
    corpus = find_corpus(str(corpus_dir))
    tokens = np.array(tokenize_corpus(corpus, ByteTokenizer()))  # a copy, not a view of the file
    data = next((_private_cache / "tokens").glob("*.bin"))
    with open(data, "r+b") as f:
        f.truncate(os.path.getsize(data) - 2)  # as if a write had been cut short
    again = tokenize_corpus(corpus, ByteTokenizer())
    assert np.array_equal(np.asarray(again), np.asarray(tokens))


def test_tokenized_arrays_are_checked(tmp_path: Path) -> None:
    np.save(tmp_path / "ok.npy", np.array([1, 2, 258], dtype=np.int64))
    assert tokenize_corpus(find_corpus(str(tmp_path / "ok.npy")), ByteTokenizer()).tolist() == [1, 2, 258]
    np.arange(5, dtype=np.uint16).tofile(tmp_path / "ok.bin")
    assert tokenize_corpus(find_corpus(str(tmp_path / "ok.bin")), ByteTokenizer()).tolist() == [0, 1, 2, 3, 4]
    np.save(tmp_path / "big.npy", np.array([1, 400]))
    with pytest.raises(UserError, match=r"holds token id 400 but the vocabulary has 259 ids"):
        tokenize_corpus(find_corpus(str(tmp_path / "big.npy")), ByteTokenizer())
    np.save(tmp_path / "two.npy", np.zeros((2, 2), dtype=np.int32))
    with pytest.raises(UserError, match=r"expected a 1-D integer array"):
        tokenize_corpus(find_corpus(str(tmp_path / "two.npy")), ByteTokenizer())
    (tmp_path / "junk.npy").write_bytes(b"not numpy")
    with pytest.raises(UserError, match=r"junk.npy: cannot be read as an array"):
        tokenize_corpus(find_corpus(str(tmp_path / "junk.npy")), ByteTokenizer())
