"""Which data a run trained on, so that ``--resume`` continues on the same data.

Every checkpoint's ``trainer.json`` records the run's data source:

- ``data``: the corpus path (made absolute) or glob, or null for the default corpus
  (the Python standard library's source);
- ``description``, ``tokens``: what the run's header showed;
- ``fingerprint``: ``sha256:`` of the token ids themselves (the tokenized corpus in the
  cache, or the given ``.bin``/``.npy``), so an edited file is noticed even at the same path;
  a streaming run (``train.streaming``), which never holds all the ids, records
  ``files:`` and a hash of every file's path, size and modification time, the text field
  and the tokenizer instead (and ``tokens`` is null). Switching streaming on or off thus
  counts as other data: the rows come in another order.

``--resume`` without ``--data`` reads the recorded source again; resuming on data whose
fingerprint differs (another ``--data``, or the same path with other contents) is refused
unless ``--new-data`` is given, and then the change is printed.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from specformer.errors import UserError

_CHUNK = 1 << 24  # tokens hashed per slice: a memory-mapped corpus is never copied whole


def fingerprint_tokens(tokens: np.ndarray) -> str:
    """``sha256:<hex>`` of the ids as stored (dtype included, so a re-encoded corpus differs)."""
    h = hashlib.sha256(np.dtype(tokens.dtype).str.encode())
    for start in range(0, len(tokens), _CHUNK):
        h.update(np.ascontiguousarray(tokens[start : start + _CHUNK]).tobytes())
    return f"sha256:{h.hexdigest()}"


def absolute_source(data: str | None) -> str | None:
    """``data`` as a path that still means the same files from another working directory."""
    return None if data is None else str(Path(data).expanduser().absolute())


def data_record(*, data: str | None, description: str, tokens: np.ndarray) -> dict[str, Any]:
    return {"data": absolute_source(data), "description": description, "tokens": int(len(tokens)),
            "fingerprint": fingerprint_tokens(tokens)}


def stream_record(*, data: str | None, description: str, corpus_fingerprint: str, tokenizer_json: str) -> dict[str, Any]:
    """The record of a streaming run: the files as they are (see the module doc), not their ids."""
    digest = hashlib.sha256(f"{corpus_fingerprint}\n{tokenizer_json}".encode()).hexdigest()
    return {"data": absolute_source(data), "description": description, "tokens": None,
            "fingerprint": f"files:{digest}", "streaming": True}


def recorded_source(record: dict[str, Any] | None) -> tuple[bool, str | None]:
    """``(known, data)``: whether the checkpoint recorded its data, and the source it recorded."""
    if not isinstance(record, dict) or "fingerprint" not in record:
        return False, None
    data = record.get("data")
    return True, data if isinstance(data, str) else None


def describe(record: dict[str, Any]) -> str:
    fingerprint = str(record.get("fingerprint", "?"))
    tokens = record.get("tokens")
    if fingerprint.startswith("files:"):
        return f"{record.get('description', record.get('data'))} (streamed, files {fingerprint[6:18]})"
    count = f"{tokens:,}" if isinstance(tokens, int) else "?"
    return f"{record.get('description', record.get('data'))} ({count} tokens, sha256 {fingerprint.removeprefix('sha256:')[:12]})"


def check_same_data(recorded: dict[str, Any] | None, current: dict[str, Any], *, new_data: bool) -> str | None:
    """None when the data is unchanged; a note when ``new_data`` allows the change; else a UserError."""
    if recorded is None or "fingerprint" not in recorded or recorded["fingerprint"] == current["fingerprint"]:
        return None
    change = f"was {describe(recorded)}, now {describe(current)}"
    if not new_data:
        raise UserError(
            f"--resume: the data differs from what the run was trained on ({change}); resume without --data "
            "to continue on the recorded data, or pass --new-data to continue on the new data"
        )
    return f"note: continuing on new data: {change}"
