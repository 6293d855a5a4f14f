"""Tokenizing in worker processes: how many, and the same ids as one process."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from specformer.errors import SpecError
from specformer.tokenizers.tokenizer import ByteTokenizer
from specformer_text.cache import tokenize_corpus
from specformer_text.corpus import find_corpus
from specformer_text.tokenization import train_bpe
from specformer_text.tokenize_workers import PARALLEL_MIN_BYTES, choose_workers

from fixtures.corpus import make_text
from fixtures.tiny_train import tiny_train_spec


def test_auto_uses_workers_only_where_they_pay() -> None:
    bpe = train_bpe([make_text(300, seed=0)], vocab_size=300)
    assert choose_workers(3, tokenizer=ByteTokenizer(), total_bytes=10) == 3  # a count is obeyed
    assert choose_workers("auto", tokenizer=ByteTokenizer(), total_bytes=10 * PARALLEL_MIN_BYTES) == 1
    assert choose_workers("auto", tokenizer=bpe, total_bytes=PARALLEL_MIN_BYTES - 1) == 1
    assert 1 <= choose_workers("auto", tokenizer=bpe, total_bytes=PARALLEL_MIN_BYTES) <= 8


def test_the_worker_count_is_checked() -> None:
    import specformer

    with pytest.raises(SpecError, match=r"train.tokenize_workers: .*auto or a process count from 1 to 256"):
        specformer.load_spec(tiny_train_spec(tokenize_workers=0))


@pytest.mark.slow
def test_worker_processes_give_the_ids_of_one_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from specformer_text import tokenize_workers

    folder = tmp_path / "c"
    folder.mkdir()
    for i in range(6):
        (folder / f"d{i}.txt").write_text(make_text(3000, seed=i))
    bpe = train_bpe(find_corpus(str(folder)).documents(), vocab_size=400)
    monkeypatch.setattr(tokenize_workers, "_CHUNK_BYTES", 5000)  # several chunks, more than 2 per worker in flight
    serial = np.array(tokenize_corpus(find_corpus(str(folder)), bpe, cache=str(tmp_path / "one"), workers=1))
    parallel = np.array(tokenize_corpus(find_corpus(str(folder)), bpe, cache=str(tmp_path / "two"), workers=2))
    assert len(serial) > 10_000 and np.array_equal(serial, parallel)
