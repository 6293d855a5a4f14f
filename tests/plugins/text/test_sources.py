"""Hugging Face `datasets` sources read offline: parquet, arrow, json/jsonl folders, save_to_disk directories."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specformer.cli.main import main
from specformer.errors import UserError
from specformer_text.corpus import find_corpus
from specformer_text.sources import read_documents

from fixtures.tiny_train import tiny_train_spec

TEXTS = [f"document number {i}: " + "word " * (i % 7) for i in range(23)]


def _parquet(path: Path, texts: list[str], *, field: str = "text", row_group_size: int = 5) -> Path:
    table = pa.table({field: texts, "id": list(range(len(texts)))})
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def _saved(path: Path, texts: list[str], *, field: str = "text") -> Path:
    import datasets

    datasets.Dataset.from_dict({field: texts, "n": list(range(len(texts)))}).save_to_disk(str(path))
    return path


def test_parquet_rows_are_documents_in_order_and_skip_passes_over_row_groups(tmp_path: Path) -> None:
    path = _parquet(tmp_path / "d.parquet", TEXTS)
    assert list(find_corpus(str(path)).documents()) == TEXTS
    for skip in (0, 4, 5, 11, 22, 23, 40):
        assert list(read_documents(path, skip=skip)) == TEXTS[skip:]


def test_a_saved_dataset_and_its_arrow_file_read_through_datasets(tmp_path: Path) -> None:
    saved = _saved(tmp_path / "saved", TEXTS)
    corpus = find_corpus(str(saved))
    assert corpus.files == [saved] and list(corpus.documents()) == TEXTS
    assert list(read_documents(saved, skip=20)) == TEXTS[20:]
    arrow = next(saved.glob("*.arrow"))
    assert list(find_corpus(str(arrow)).documents()) == TEXTS


def test_a_dataset_dict_reads_its_train_split(tmp_path: Path) -> None:
    import datasets

    splits = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["a", "b"]}),
                                   "test": datasets.Dataset.from_dict({"text": ["c"]})})
    splits.save_to_disk(str(tmp_path / "dd"))
    assert list(find_corpus(str(tmp_path / "dd")).documents()) == ["a", "b"]
    datasets.DatasetDict({"test": datasets.Dataset.from_dict({"text": ["c"]})}).save_to_disk(str(tmp_path / "only"))
    with pytest.raises(UserError, match=r"a DatasetDict without a 'train' split \(it has: test\)"):
        find_corpus(str(tmp_path / "only"))


def test_json_arrays_and_jsonl_folders_use_the_text_field(tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.json").write_text(json.dumps([{"body": t} for t in TEXTS[:3]]))
    (folder / "sub" / "b.jsonl").write_text("\n".join(json.dumps({"body": t}) for t in TEXTS[3:6]) + "\n")
    (folder / ".hidden.jsonl").write_text("not json")
    corpus = find_corpus(str(folder), text_field="body")
    assert list(corpus.documents()) == TEXTS[:6]
    assert list(read_documents(folder / "a.json", text_field="body", skip=1)) == TEXTS[1:3]
    # The same files under another field are other tokens: the cache key changes.
    assert find_corpus(str(folder), text_field="text").fingerprint() != corpus.fingerprint()


def test_a_folder_mixing_files_and_a_saved_dataset_reads_each_once(tmp_path: Path) -> None:
    folder = tmp_path / "mixed"
    folder.mkdir()
    _saved(folder / "b_saved", TEXTS[:4])
    _parquet(folder / "a.parquet", TEXTS[4:8])
    (folder / "c.txt").write_text("plain text")
    corpus = find_corpus(str(folder))
    assert [p.name for p in corpus.files] == ["a.parquet", "b_saved", "c.txt"]  # state.json is no document
    assert list(corpus.documents()) == [*TEXTS[4:8], *TEXTS[:4], "plain text"]


@pytest.mark.parametrize("make, needle", [
    (lambda d: _parquet(d / "x.parquet", TEXTS, field="body"),
     r"x.parquet: no 'text' column \(columns: body, id\); name the text field with --text-field NAME"),
    (lambda d: _saved(d / "s", TEXTS, field="content"), r"s: no 'text' column \(columns: content, n\)"),
    (lambda d: pq.write_table(pa.table({"text": [1, 2]}), d / "n.parquet") or d / "n.parquet",
     r"n.parquet: the 'text' column holds int64, not text"),
    (lambda d: (d / "bad.parquet").write_bytes(b"PAR1 this is not parquet") and d / "bad.parquet",
     r"bad.parquet: not a readable Parquet file"),
    (lambda d: (d / "bad.arrow").write_bytes(b"garbage") and d / "bad.arrow",
     r"bad.arrow: not a readable Arrow file of a Hugging Face dataset"),
    (lambda d: (d / "empty").mkdir() or d / "empty", r"the directory holds no .* file and no saved datasets"),
    (lambda d: (d / "deep.jsonl").write_text('{"text": ' + "[" * 100_000 + "]" * 100_000 + "}\n") and d / "deep.jsonl",
     r"deep.jsonl:1: JSON nested too deeply to read"),
    (lambda d: (d / "deep.json").write_text("[" * 100_000 + "]" * 100_000) and d / "deep.json",
     r"deep.json: JSON nested too deeply to read"),
    (lambda d: (d / "lone.jsonl").write_text('{"text": "ok"}\n{"text": "ab\\ud800cd"}\n') and d / "lone.jsonl",
     r"lone.jsonl:2: the 'text' field holds a lone surrogate \(\\ud800 at character 2\), which is not text"),
])
def test_bad_sources_are_one_clear_error(tmp_path: Path, make, needle: str) -> None:
    path = make(tmp_path)
    with pytest.raises(UserError, match=needle):
        list(find_corpus(str(path)).documents())


def test_a_null_text_value_names_its_record(tmp_path: Path) -> None:
    path = tmp_path / "n.parquet"
    pq.write_table(pa.table({"text": ["a", None, "c"]}), path)
    with pytest.raises(UserError, match=r"n.parquet: record 2 has no text in 'text' \(it is None\)"):
        list(find_corpus(str(path)).documents())


def test_the_command_line_names_the_field_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import yaml

    data = _parquet(tmp_path / "d.parquet", TEXTS, field="body")
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump(tiny_train_spec(out_dir=str(tmp_path / "out"))))
    assert main(["train", str(spec), "--data", str(data)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no 'text' column (columns: body, id)" in err[0]


def test_the_command_line_trains_on_the_named_field(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import yaml

    data = _parquet(tmp_path / "d.parquet", TEXTS * 20, field="body")
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump(tiny_train_spec(out_dir=str(tmp_path / "out"), steps=2, eval_every=0, eval_steps=1)))
    assert main(["train", str(spec), "--data", str(data), "--text-field", "body"]) == 0, capsys.readouterr().err
    assert f"data    {data}:" in capsys.readouterr().out


def test_files_without_records_are_one_clear_error(tmp_path: Path) -> None:
    from specformer.tokenizers.tokenizer import ByteTokenizer
    from specformer_text.cache import tokenize_corpus

    pq.write_table(pa.table({"text": pa.array([], pa.string())}), tmp_path / "empty.parquet")
    with pytest.raises(UserError, match=r"empty.parquet: the corpus holds no document"):
        tokenize_corpus(find_corpus(str(tmp_path / "empty.parquet")), ByteTokenizer(), cache=str(tmp_path / "c"))
    assert not list((tmp_path / "c" / "tokens").iterdir())  # no entry, no temporary left
