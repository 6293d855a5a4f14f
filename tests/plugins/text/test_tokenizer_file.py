"""load_tokenizer_json's refusals of an end-of-text token it cannot look up."""

from __future__ import annotations

import pytest

from specformer.errors import UserError
from specformer_text import train_bpe
from specformer_text.tokenizer_file import load_tokenizer_json


@pytest.fixture
def tokenizer_json(tmp_path):
    tokenizer = train_bpe(["the cat sat on the mat " * 20], vocab_size=280)
    path = tmp_path / "tokenizer.json"
    path.write_text(tokenizer.inner.to_str())
    return path


def test_an_end_of_text_token_that_is_not_text_is_one_user_error(tokenizer_json) -> None:
    """Bytes on a command line that are not UTF-8 reach Python as lone surrogates, which tokenizers cannot encode."""
    with pytest.raises(UserError, match=r"end-of-text token '\\udce9\\udcff' is not text"):
        load_tokenizer_json(tokenizer_json, config={}, vocab_size=None, eos_token="\udce9\udcff")


def test_an_end_of_text_token_the_tokenizer_lacks_is_named(tokenizer_json) -> None:
    with pytest.raises(UserError, match="has no token 'zzz-not-there'"):
        load_tokenizer_json(tokenizer_json, config={}, vocab_size=None, eos_token="zzz-not-there")
