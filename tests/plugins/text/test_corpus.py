"""Finding the corpus: files, directories, globs, JSONL, tokenized arrays, the default, bad input."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from specformer.errors import UserError
from specformer_text.corpus import DEFAULT_CORPUS_BYTES, default_corpus, find_corpus


def test_a_file_a_directory_and_a_glob(corpus_dir: Path) -> None:
    one = find_corpus(str(corpus_dir / "doc0.txt"))
    assert one.files == [corpus_dir / "doc0.txt"]
    (corpus_dir / "sub").mkdir()
    (corpus_dir / "sub" / "extra.md").write_text("# notes\n")
    (corpus_dir / "ignored.csv").write_text("a,b\n")
    (corpus_dir / ".hidden").mkdir()
    (corpus_dir / ".hidden" / "secret.txt").write_text("no\n")
    everything = find_corpus(str(corpus_dir))
    assert [p.name for p in everything.files] == ["doc0.txt", "doc1.txt", "doc2.txt", "extra.md"]
    globbed = find_corpus(str(corpus_dir / "doc[12].txt"))
    assert [p.name for p in globbed.files] == ["doc1.txt", "doc2.txt"]
    assert list(globbed.documents()) == [(corpus_dir / f"doc{i}.txt").read_text() for i in (1, 2)]


def test_jsonl_documents_come_from_the_text_field(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"text": "first"}) + "\n\n" + json.dumps({"text": "second", "id": 2}) + "\n")
    assert list(find_corpus(str(path)).documents()) == ["first", "second"]
    path.write_text(json.dumps({"text": "ok"}) + "\n" + json.dumps({"body": "x"}) + "\n")
    with pytest.raises(UserError, match=r"d.jsonl:2: no 'text' field \(the record has: body\); name the text "
                                        r"field with --text-field NAME"):
        list(find_corpus(str(path)).documents())
    path.write_text(json.dumps({"text": 3}) + "\n")
    with pytest.raises(UserError, match=r"d.jsonl:1: the 'text' field is int, not a string"):
        list(find_corpus(str(path)).documents())
    path.write_text("{not json\n")
    with pytest.raises(UserError, match=r"d.jsonl:1: not valid JSON"):
        list(find_corpus(str(path)).documents())


def test_a_tokenized_array_must_be_alone(tmp_path: Path) -> None:
    np.save(tmp_path / "t.npy", np.arange(10, dtype=np.int32))
    corpus = find_corpus(str(tmp_path / "t.npy"))
    assert corpus.tokenized == tmp_path / "t.npy" and corpus.files == []
    (tmp_path / "a.txt").write_text("x")
    with pytest.raises(UserError, match="must be the only input"):
        find_corpus(str(tmp_path / "*"))


@pytest.mark.parametrize("make, needle", [
    (lambda d: str(d / "missing.txt"), "no such file or directory"),
    (lambda d: str(d / "nothing*.txt"), "matches no file"),
    (lambda d: (d / "x.csv").write_text("a") and str(d / "x.csv"), "file type .csv is not accepted; accepted: .txt"),
    (lambda d: (d / "e.txt").write_text("") and False or str(d / "e.txt"), "the corpus is empty"),
    (lambda d: (d / "empty").mkdir() or str(d / "empty"), "holds no .txt"),
])
def test_bad_data_is_a_user_error_naming_it(tmp_path: Path, make, needle: str) -> None:
    with pytest.raises(UserError) as info:
        find_corpus(make(tmp_path))
    assert needle in str(info.value)


def test_a_file_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    (tmp_path / "latin.txt").write_bytes("caf\xe9".encode("latin-1"))
    corpus = find_corpus(str(tmp_path / "latin.txt"))
    with pytest.raises(UserError, match=r"latin.txt: not UTF-8 text \(byte 3"):
        list(corpus.documents())


def test_an_unreadable_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "gone.txt"
    path.write_text("soon gone")
    corpus = find_corpus(str(path))
    path.unlink()  # disappears between listing and reading (chmod does not stop root)
    with pytest.raises(UserError, match=r"gone.txt: cannot be read"):
        list(corpus.documents())


def test_the_default_corpus_is_the_standard_library_capped() -> None:
    corpus = default_corpus()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    assert corpus.files and all(p.suffix == ".py" and stdlib in p.parents for p in corpus.files)
    assert all("test" not in p.relative_to(stdlib).parts for p in corpus.files)
    assert 0.5 * DEFAULT_CORPUS_BYTES < corpus.total_bytes <= DEFAULT_CORPUS_BYTES
    assert default_corpus().files == corpus.files, "the same files on every run"
    assert find_corpus(None).files == corpus.files
    small = default_corpus(max_bytes=50_000)
    assert small.total_bytes <= 50_000
