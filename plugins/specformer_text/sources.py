"""Reading the documents of one corpus file, in order, from any document on.

Each kind of file yields its documents' texts:

- ``.txt``, ``.md``, ``.py``: the whole file is one document;
- ``.jsonl``: one JSON object per line, its text field (``train.text_field``, default ``text``);
- ``.json``: JSON Lines as well, or one JSON array of such objects (what the Hugging Face
  ``json`` builder reads);
- ``.parquet``: the text column, read one record batch at a time with ``pyarrow``;
- ``.arrow``: a Hugging Face ``datasets`` Arrow file, memory-mapped by ``datasets``;
- a directory written by ``Dataset.save_to_disk`` (``state.json`` and
  ``dataset_info.json`` inside; a ``DatasetDict``'s ``train`` split), memory-mapped by
  ``datasets.load_from_disk``.

Nothing is loaded whole (a ``.json`` array excepted), so streaming (``train.streaming``)
can start at any document of any file: ``skip`` documents are passed over. ``datasets``
and ``pyarrow`` are imported only when such a file is read. Every problem (a missing
field, a value that is not text, a file that cannot be parsed) is one :class:`UserError`
naming the file and, where it helps, the record.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from specformer.errors import UserError

TEXT_SUFFIXES = (".txt", ".md", ".py")
JSONL_SUFFIX = ".jsonl"
RECORD_SUFFIXES = (".jsonl", ".json", ".parquet", ".arrow")
_BATCH = 1024  # records read at a time from columnar files


def is_saved_dataset(path: Path) -> bool:
    """Whether ``path`` is a directory ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` wrote."""
    return path.is_dir() and ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file())


def read_documents(path: Path, *, text_field: str = "text", skip: int = 0) -> Iterator[str]:
    """The texts of the documents in ``path`` from document ``skip`` on (0-based), in file order."""
    if path.is_dir():
        yield from _dataset_documents(_load_saved(path, text_field), path, text_field, skip)
    elif path.suffix in TEXT_SUFFIXES:
        if skip == 0:
            yield read_text(path)
    elif path.suffix in (".jsonl", ".json"):
        yield from _json_documents(path, text_field, skip)
    elif path.suffix == ".parquet":
        yield from _parquet_documents(path, text_field, skip)
    elif path.suffix == ".arrow":
        yield from _dataset_documents(_load_arrow(path, text_field), path, text_field, skip)
    else:
        raise UserError(f"{path}: cannot read documents from a {path.suffix or 'suffix-less'} file")


def check_readable(path: Path, *, text_field: str) -> None:
    """Fail now, not mid-run, when a columnar file or saved dataset cannot be read or lacks the field."""
    if path.is_dir():
        _load_saved(path, text_field)
    elif path.suffix == ".parquet":
        _open_parquet(path, text_field)
    elif path.suffix == ".arrow":
        _load_arrow(path, text_field)


def read_text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason}); convert it or leave it out") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot be read ({exc.strerror or exc})") from None


# -- JSON ---------------------------------------------------------------------------------


def _json_documents(path: Path, field: str, skip: int) -> Iterator[str]:
    text = read_text(path)
    if path.suffix == ".json" and text.lstrip().startswith("["):
        records = _loads(text, where=str(path), say_line=True)
        for number, record in enumerate(records[skip:], start=skip + 1):
            yield _field_of(record, field, where=f"{path}: record {number}")
        return
    index = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if index >= skip:
            record = _loads(line, where=f"{path}:{number}")
            yield _field_of(record, field, where=f"{path}:{number}")
        index += 1


def _loads(text: str, *, where: str, say_line: bool = False) -> Any:
    """A JSON value, or one UserError naming ``where`` (nesting too deep for the parser counts as invalid)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        line = f"line {exc.lineno}: " if say_line else ""
        raise UserError(f"{where}: not valid JSON ({line}{exc.msg})") from None
    except RecursionError:
        raise UserError(f"{where}: JSON nested too deeply to read") from None


def _field_of(record: Any, field: str, *, where: str) -> str:
    if not isinstance(record, dict):
        raise UserError(f"{where}: each record must be a JSON object with a string {field!r} field")
    if field not in record:
        fields = ", ".join(sorted(map(str, record))) or "none"
        raise UserError(f"{where}: no {field!r} field (the record has: {fields}); name the text field with "
                        "--text-field NAME (train.text_field)")
    value = record[field]
    if not isinstance(value, str):
        raise UserError(f"{where}: the {field!r} field is {type(value).__name__}, not a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate escape ("\\ud800") is no text a tokenizer can encode
        raise UserError(f"{where}: the {field!r} field holds a lone surrogate (\\u{ord(value[exc.start]):04x} at "
                        f"character {exc.start}), which is not text; fix or drop the record") from None
    return value


# -- Parquet (pyarrow) -------------------------------------------------------------------


def _open_parquet(path: Path, field: str) -> Any:
    import pyarrow.parquet as pq  # late: pyarrow comes with the optional datasets extra

    try:
        handle = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ...: all mean "not readable"
        raise UserError(f"{path}: not a readable Parquet file ({_why(exc)})") from None
    _check_column(path, handle.schema_arrow, field)
    return handle


def _parquet_documents(path: Path, field: str, skip: int) -> Iterator[str]:
    handle = _open_parquet(path, field)
    # Whole row groups before ``skip`` are never decoded.
    groups, passed = [], 0
    for group in range(handle.num_row_groups):
        rows = handle.metadata.row_group(group).num_rows
        if not groups and passed + rows <= skip:
            passed += rows
            continue
        groups.append(group)  # this group and every one after it
    if not groups:
        return
    index = passed
    try:
        for batch in handle.iter_batches(batch_size=_BATCH, row_groups=groups, columns=[field]):
            for value in batch.column(0).to_pylist():
                if index >= skip:
                    yield _text_value(value, path, field, index)
                index += 1
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid and ArrowIOError derive from these
        raise UserError(f"{path}: not a readable Parquet file ({_why(exc)})") from None


# -- Arrow files and saved datasets (datasets) ---------------------------------------------


def _load_arrow(path: Path, field: str) -> Any:
    datasets = _datasets()
    try:
        dataset = datasets.Dataset.from_file(str(path))
    except Exception as exc:
        raise UserError(f"{path}: not a readable Arrow file of a Hugging Face dataset ({_why(exc)})") from None
    _check_column(path, dataset.data.schema, field)
    return dataset


def _load_saved(path: Path, field: str) -> Any:
    datasets = _datasets()
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as exc:
        raise UserError(f"{path}: not a readable datasets directory ({_why(exc)})") from None
    if isinstance(loaded, datasets.DatasetDict):
        if "train" not in loaded:
            raise UserError(f"{path}: a DatasetDict without a 'train' split (it has: {', '.join(loaded)}); "
                            f"give the split's own directory, e.g. --data {path / next(iter(loaded))}")
        loaded = loaded["train"]
    _check_column(path, loaded.data.schema, field)
    return loaded


def _dataset_documents(dataset: Any, path: Path, field: str, skip: int) -> Iterator[str]:
    column = dataset.select_columns([field])
    for start in range(skip, len(column), _BATCH):
        values = column[start : start + _BATCH][field]  # read from the memory map, a batch at a time
        for offset, value in enumerate(values):
            yield _text_value(value, path, field, start + offset)


def _datasets() -> Any:
    try:  # late: datasets is an optional extra, and slow to import
        import datasets
    except ImportError:
        raise UserError("reading .arrow files and datasets directories needs the 'datasets' package: "
                        "pip install 'specformer[train]'") from None
    datasets.disable_progress_bars()  # specformer prints its own progress
    return datasets


# -- shared checks ---------------------------------------------------------------------------


def _check_column(path: Path, schema: Any, field: str) -> None:
    import pyarrow as pa  # late: pyarrow comes with the optional datasets extra

    names = list(schema.names)
    if field not in names:
        raise UserError(f"{path}: no {field!r} column (columns: {', '.join(names) or 'none'}); name the text "
                        "field with --text-field NAME (train.text_field)")
    kind = schema.field(field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)):
        raise UserError(f"{path}: the {field!r} column holds {kind}, not text; name the text field with "
                        "--text-field NAME (train.text_field)")


def _text_value(value: Any, path: Path, field: str, index: int) -> str:
    if not isinstance(value, str):
        raise UserError(f"{path}: record {index + 1} has no text in {field!r} (it is {value!r})")
    return value


def _why(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
