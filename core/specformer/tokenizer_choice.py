"""Which tokenizer a checkpoint's text goes through: the one rule every command uses.

``generate``, ``chat``, ``eval``, ``inspect``, ``serve``, ``train --init``, ``hf export``
and ``hf attach-tokenizer`` all ask :func:`checkpoint_tokenizer`, so one file gets one
answer everywhere:

1. ``--tokenizer FILE`` when given (a Hugging Face tokenizer.json, or the JSON specformer
   writes), if the model has an embedding row for each of its tokens;
2. else the tokenizer stored in the header;
3. else, for a header with no tokenizer entry at all (``specformer.save(specformer.build(...))``
   writes such files), the byte tokenizer exactly when the vocabulary is the byte
   tokenizer's 259 ids. Any other vocabulary would turn text into ids that mean nothing
   to the model, so it is refused with how to give the tokenizer, as is a header that
   records it has none (a Hugging Face import without tokenizer.json).

Commands that can work on token ids alone (``generate --ids``, ``serve``) ask with
``ids_only=True`` and get a :class:`~specformer.tokenizers.tokenizer.NoTokenizer` instead of the refusal.
"""

from __future__ import annotations

import json
from pathlib import Path

from specformer.tokenizers.byte_file import is_byte_tokenizer_json
from specformer.errors import UserError
from specformer.tokenizers.tokenizer import (
    BPETokenizer,
    ByteTokenizer,
    NoTokenizer,
    Tokenizer,
    tokenizer_from_json,
    tokenizer_from_metadata,
)

#: The byte tokenizer's vocabulary: a checkpoint of this size without a tokenizer entry is byte-level.
BYTE_VOCAB_SIZE = ByteTokenizer().vocab_size


def how_to_add_a_tokenizer(where: str) -> str:
    """The ways to give a checkpoint without a tokenizer one, named the same in every command's refusal."""
    return (f"store its tokenizer.json in the file with `specformer hf attach-tokenizer {where} TOKENIZER.json`, "
            "or pass --tokenizer TOKENIZER.json (generate, chat, eval, inspect); generate and chat also take "
            "token ids with --ids")


def checkpoint_tokenizer(metadata: dict[str, str], *, vocab_size: int, where: str,
                         override: str | Path | None = None, ids_only: bool = False) -> Tokenizer:
    """The tokenizer for the checkpoint whose header is ``metadata`` (see the module doc).

    ``vocab_size`` is the model's (the spec's ``model.vocab_size``); ``where`` names the file
    in messages; ``override`` is ``--tokenizer``. UserError when there is no tokenizer to use
    (unless ``ids_only``), or when ``override`` is unreadable or larger than the model.
    """
    if override is not None:
        found = tokenizer_file(override, option="--tokenizer")
        if found.vocab_size > vocab_size:
            raise UserError(f"--tokenizer {str(override)!r}: has {found.vocab_size:,} tokens but the model of {where} "
                            f"has only {vocab_size:,} embedding rows; this tokenizer belongs to another model")
        return found
    stored = tokenizer_from_metadata(metadata)
    if stored is not None and stored.kind != "none":
        return stored
    if stored is None and vocab_size == BYTE_VOCAB_SIZE:
        return ByteTokenizer()
    if ids_only:
        return stored if stored is not None else NoTokenizer(vocab_size=vocab_size)
    if stored is None:
        cause = (f"stores no tokenizer, and its vocabulary of {vocab_size} ids is not the byte tokenizer's "
                 f"({BYTE_VOCAB_SIZE})")
    else:
        cause = (f"has no tokenizer (it was imported from a Hugging Face folder without tokenizer.json; its "
                 f"vocabulary has {vocab_size} ids)")
    raise UserError(f"{where}: {cause}, so text cannot be encoded for it; {how_to_add_a_tokenizer(where)}")


def tokenizer_file(path: str | Path, *, option: str) -> Tokenizer:
    """The tokenizer in a file: specformer's JSON (``{"kind": ...}``), the byte tokenizer's tokenizer.json
    (as ``hf export`` writes it), or any other Hugging Face tokenizer.json. ``option`` names the file's flag."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{option} {str(path)!r}: no such file; give a tokenizer.json "
                        "(Hugging Face, or the JSON specformer writes)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise UserError(f"{option} {str(path)!r}: not a readable JSON tokenizer ({exc})") from None
    if isinstance(data, dict) and "kind" in data:
        return tokenizer_from_json(json.dumps(data))
    if is_byte_tokenizer_json(data):
        return ByteTokenizer()
    return BPETokenizer.from_file(str(path))


__all__ = ["BYTE_VOCAB_SIZE", "checkpoint_tokenizer", "how_to_add_a_tokenizer", "tokenizer_file"]
