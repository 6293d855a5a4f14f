"""Tokenizers of a run: bytes, a BPE trained on the corpus, a tokenizer.json; vocab checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specformer.errors import UserError
from specformer.tokenizers.tokenizer import END_OF_TEXT, ByteTokenizer
from specformer_train.checkpointing import tokenizer_file_text
from specformer_text.corpus import find_corpus
from specformer_text.tokenization import make_tokenizer


def test_byte_tokenizer_needs_vocab_259(corpus_dir: Path) -> None:
    corpus = find_corpus(str(corpus_dir))
    assert isinstance(make_tokenizer("byte", vocab_size=259, corpus=corpus), ByteTokenizer)
    with pytest.raises(UserError, match=r"has 259 tokens but model.vocab_size is 300; set model.vocab_size to 259"):
        make_tokenizer("byte", vocab_size=300, corpus=corpus)


def test_bpe_is_trained_at_the_spec_vocab_size_and_cached(corpus_dir: Path, _private_cache: Path) -> None:
    corpus = find_corpus(str(corpus_dir))
    tokenizer = make_tokenizer("bpe", vocab_size=320, corpus=corpus)
    assert tokenizer.vocab_size == 320
    assert tokenizer.inner.token_to_id(END_OF_TEXT) == tokenizer.eot_id
    text = (corpus_dir / "doc0.txt").read_text()
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text and len(ids) < 0.7 * len(text.encode()), "merges must shorten the text"
    cached = list((_private_cache / "tokenizers").glob("bpe-320-*.json"))
    assert len(cached) == 1
    again = make_tokenizer("bpe", vocab_size=320, corpus=corpus)
    assert again.inner.to_str() == tokenizer.inner.to_str()


def test_bpe_on_too_little_text_says_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("ab ab ab\n")
    with pytest.raises(UserError, match=r"too small to learn 5000 BPE tokens \(it yields \d+\); set model.vocab_size to"):
        make_tokenizer("bpe", vocab_size=5000, corpus=find_corpus(str(tmp_path / "a.txt")))
    with pytest.raises(UserError, match=r"needs model.vocab_size >= 259"):
        make_tokenizer("bpe", vocab_size=100, corpus=find_corpus(str(tmp_path / "a.txt")))


def test_a_tokenizer_json_path_either_format(corpus_dir: Path, tmp_path: Path) -> None:
    corpus = find_corpus(str(corpus_dir))
    bpe = make_tokenizer("bpe", vocab_size=300, corpus=corpus)
    hf_file = tmp_path / "tokenizer.json"
    hf_file.write_text(tokenizer_file_text(bpe))
    loaded = make_tokenizer(str(hf_file), vocab_size=300, corpus=corpus)
    assert loaded.encode("the river") == bpe.encode("the river")
    byte_file = tmp_path / "byte.json"
    byte_file.write_text(tokenizer_file_text(ByteTokenizer()))
    assert json.loads(byte_file.read_text()) == {"kind": "byte"}
    assert isinstance(make_tokenizer(str(byte_file), vocab_size=259, corpus=corpus), ByteTokenizer)
    with pytest.raises(UserError, match=r"has 300 tokens but model.vocab_size is 259"):
        make_tokenizer(str(hf_file), vocab_size=259, corpus=corpus)


def test_unknown_tokenizer_choice_lists_the_accepted_ones(corpus_dir: Path) -> None:
    with pytest.raises(UserError, match=r"'sentencepiece': no such file; accepted: byte, bpe, or the path to a tokenizer.json"):
        make_tokenizer("sentencepiece", vocab_size=259, corpus=find_corpus(str(corpus_dir)))
