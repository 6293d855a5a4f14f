"""Tokenizers stored with a checkpoint, so a model always decodes with the ids it was trained on.

Two kinds: ``byte`` (the UTF-8 bytes of the text, 256 ids, then special tokens) and
``bpe`` (a Hugging Face ``tokenizers`` tokenizer, serialised as its ``tokenizer.json``).
Both are written as one JSON string under the checkpoint header key ``tokenizer``.
A third, ``none``, records that a checkpoint has no tokenizer at all (a Hugging Face
import without ``tokenizer.json``): token ids work, text is refused. Which tokenizer a
command uses for a checkpoint (a header without the key included) is decided in one
place, :func:`specformer.tokenizers.choice.checkpoint_tokenizer`.
"""

from __future__ import annotations

import json
from typing import Any, Protocol, runtime_checkable

from specformer.errors import CheckpointError, UserError, excerpt

METADATA_KEY = "tokenizer"
END_OF_TEXT = "<|endoftext|>"
SPECIAL_TOKENS = (END_OF_TEXT, "<|pad|>", "<|bos|>")


@runtime_checkable
class Tokenizer(Protocol):
    kind: str
    vocab_size: int
    eot_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def to_json(self) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255; ``<|endoftext|>`` = 256, ``<|pad|>`` = 257, ``<|bos|>`` = 258."""

    kind = "byte"

    def __init__(self) -> None:
        self.vocab_size = 256 + len(SPECIAL_TOKENS)
        self.eot_id = 256
        self.pad_id = 257
        self.bos_id = 258

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        # Special tokens are not text; a cut multi-byte character decodes to U+FFFD.
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def to_json(self) -> str:
        return json.dumps({"kind": self.kind})


class BPETokenizer:
    """A byte-level BPE tokenizer from the Hugging Face ``tokenizers`` library."""

    kind = "bpe"

    def __init__(self, tokenizer: Any, *, eot_token: str = END_OF_TEXT) -> None:
        self.inner = tokenizer
        self.vocab_size = tokenizer.get_vocab_size()
        eot = tokenizer.token_to_id(eot_token)
        if eot is None:
            raise UserError(f"the BPE tokenizer has no {eot_token!r} token; specformer separates documents with it")
        # Imported tokenizers end documents with their own token (Llama's "</s>", Gemma's "<eos>").
        self.eot_token = eot_token
        self.eot_id = eot

    @classmethod
    def from_file(cls, path: str) -> "BPETokenizer":
        from tokenizers import Tokenizer as HFTokenizer

        try:
            return cls(HFTokenizer.from_file(str(path)))
        except Exception as exc:
            raise UserError(f"{path}: not a readable tokenizer.json ({exc})") from None

    def encode(self, text: str) -> list[int]:
        return self.inner.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        return self.inner.decode(list(ids))

    def to_json(self) -> str:
        data = {"kind": self.kind, "tokenizer": json.loads(self.inner.to_str())}
        if self.eot_token != END_OF_TEXT:
            data["eot_token"] = self.eot_token
        return json.dumps(data)


#: What a checkpoint without a tokenizer says when asked for text.
NO_TOKENIZER_HINT = (
    "this checkpoint has no tokenizer (it was imported from a Hugging Face folder without tokenizer.json), "
    "so it works on token ids only; attach one with `specformer hf attach-tokenizer CHECKPOINT TOKENIZER.json`, "
    "or import again with `specformer hf import --tokenizer TOKENIZER.json DIR OUT.safetensors`"
)


class NoTokenizer:
    """The checkpoint has no tokenizer: ids only. ``encode`` and ``decode`` raise UserError saying how to add one.

    ``eot_id`` is the end-of-text id when the model's config named one, else None.
    """

    kind = "none"

    def __init__(self, *, vocab_size: int, eot_id: int | None = None) -> None:
        self.vocab_size = vocab_size
        self.eot_id = eot_id

    def encode(self, text: str) -> list[int]:
        raise UserError(NO_TOKENIZER_HINT)

    def decode(self, ids: list[int]) -> str:
        raise UserError(NO_TOKENIZER_HINT)

    def to_json(self) -> str:
        data: dict[str, Any] = {"kind": self.kind, "vocab_size": self.vocab_size}
        if self.eot_id is not None:
            data["eot_id"] = self.eot_id
        return json.dumps(data)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def tokenizer_from_json(text: str) -> Tokenizer:
    """Rebuild a tokenizer from :meth:`to_json` output."""
    try:
        data = json.loads(text)
        kind = data["kind"]
    except (json.JSONDecodeError, KeyError, TypeError, RecursionError) as exc:
        raise CheckpointError(f"the stored tokenizer is not valid ({excerpt(str(exc), 200)})") from None
    if kind == "byte":
        return ByteTokenizer()
    if kind == "bpe":
        return _bpe_from_json(data)
    if kind == "none":
        vocab_size, eot_id = data.get("vocab_size"), data.get("eot_id")
        if not _is_int(vocab_size) or not (eot_id is None or _is_int(eot_id)):
            raise CheckpointError("the stored 'none' tokenizer needs an integer vocab_size and an integer or absent eot_id")
        return NoTokenizer(vocab_size=vocab_size, eot_id=eot_id)
    raise CheckpointError(f"unknown stored tokenizer kind {excerpt(kind)}; known: byte, bpe, none")


def _bpe_from_json(data: dict[str, Any]) -> "BPETokenizer":
    """A stored BPE entry: its ``tokenizer`` must be a tokenizer.json object the library reads (found by fuzzing)."""
    from tokenizers import Tokenizer as HFTokenizer

    inner, eot_token = data.get("tokenizer"), data.get("eot_token", END_OF_TEXT)
    if not isinstance(inner, dict) or not isinstance(eot_token, str):
        raise CheckpointError("the stored BPE tokenizer needs a 'tokenizer' object (a tokenizer.json) and a string "
                              f"'eot_token'; got {type(inner).__name__} and {type(eot_token).__name__}")
    try:
        tokenizer = HFTokenizer.from_str(json.dumps(inner))
    except Exception as exc:  # noqa: BLE001 - the tokenizers library raises plain Exception for a bad file
        raise CheckpointError(f"the stored BPE tokenizer is not a readable tokenizer.json ({excerpt(str(exc), 200)})") from None
    return BPETokenizer(tokenizer, eot_token=eot_token)


def tokenizer_from_metadata(metadata: dict[str, str]) -> Tokenizer | None:
    """The tokenizer entry of a checkpoint header as stored; None when the header has none.

    Commands choose with :func:`specformer.tokenizers.choice.checkpoint_tokenizer`, which also
    decides what a header without an entry means.
    """
    text = metadata.get(METADATA_KEY)
    return tokenizer_from_json(text) if text else None
