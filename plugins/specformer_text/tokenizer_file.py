"""A Hugging Face ``tokenizer.json`` made into the tokenizer a checkpoint stores, or the record that there is none.

A checkpoint keeps its tokenizer in its header (see :mod:`specformer.tokenizers.tokenizer`). An
imported folder without ``tokenizer.json`` gets :class:`~specformer.tokenizers.tokenizer.NoTokenizer`
there, so that text is refused later with advice rather than read as bytes of a
vocabulary the model never saw. A tokenizer.json from elsewhere can be given at import
(``--tokenizer``) or attached to a checkpoint afterwards (:func:`attach_tokenizer`).
The byte tokenizer's tokenizer.json (:mod:`specformer.tokenizers.byte_file`, which
``hf export`` writes) is read back as the byte tokenizer itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specformer.checkpoint.save_load import read_metadata, read_tensors, write_safetensors_atomic
from specformer.errors import CheckpointError, UserError
from specformer.tokenizers.byte_file import is_byte_tokenizer_json
from specformer.files.outputs import refuse_inputs, writing
from specformer.tokenizers.tokenizer import END_OF_TEXT, METADATA_KEY, BPETokenizer, ByteTokenizer, NoTokenizer
from specformer.tokenizers.choice import checkpoint_tokenizer

from specformer_text.header_keys import CONFIG_KEY, TOKENIZER_CONFIG_KEY

TOKENIZER_JSON = "tokenizer.json"


def load_tokenizer_json(
    path: str | Path,
    *,
    config: dict[str, Any],
    vocab_size: int | None,
    eos_token: str | None = None,
) -> BPETokenizer | ByteTokenizer:
    """The tokenizer in ``path`` (a tokenizer.json, or a folder holding one), ending documents with
    ``eos_token``, else the config's ``eos_token_id`` token, else ``<|endoftext|>``. The byte
    tokenizer's own tokenizer.json gives the byte tokenizer (unless ``eos_token`` names
    another end than its ``<|endoftext|>``).

    UserError when the file is unreadable, names more tokens than the model's ``vocab_size``
    has rows, or no end-of-text token can be found.
    """
    path = Path(path)
    if path.is_dir():
        path = path / TOKENIZER_JSON
    if not path.is_file():
        raise UserError(f"{path}: no such tokenizer file; give a tokenizer.json or a folder holding one")
    inner = _read(path)
    if vocab_size is not None and inner.get_vocab_size() > vocab_size:
        raise UserError(
            f"{path}: has {inner.get_vocab_size():,} tokens but the model has only {vocab_size:,} embedding rows; "
            "this tokenizer belongs to another model"
        )
    if _is_byte_tokenizer(path) and (eos_token or end_of_text(config, inner)) == END_OF_TEXT:
        return ByteTokenizer()
    if eos_token is not None:
        try:
            eos_token.encode("utf-8")
        except UnicodeEncodeError:  # a command line's bytes that are not UTF-8 arrive as lone surrogates
            raise UserError(f"{path}: the end-of-text token {eos_token!r} is not text (it holds bytes that are not "
                            f"UTF-8); name a token the tokenizer has") from None
        if inner.token_to_id(eos_token) is None:
            raise UserError(f"{path}: has no token {eos_token!r} (given as the end-of-text token)")
        return BPETokenizer(inner, eot_token=eos_token)
    eos = end_of_text(config, inner)
    if eos is None:
        raise UserError(
            f"{path}: has no {END_OF_TEXT!r} token and the model's config names no eos_token_id, so specformer cannot "
            "tell where documents end; name the end-of-text token with --eos-token TOKEN"
        )
    return BPETokenizer(inner, eot_token=eos)


def _read(path: Path) -> Any:
    try:  # late: tokenizers is needed only when a tokenizer.json is read
        from tokenizers import Tokenizer as HFTokenizer
    except ImportError:
        raise UserError(f"{path}: reading tokenizer.json needs the tokenizers package (pip install tokenizers)") from None
    try:
        return HFTokenizer.from_file(str(path))
    except Exception as exc:
        raise UserError(f"{path}: not a readable tokenizer.json ({str(exc)[:300]})") from None


def _is_byte_tokenizer(path: Path) -> bool:
    try:
        return is_byte_tokenizer_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return False  # the tokenizers library read it; whatever it is, it is not the byte tokenizer's


def end_of_text(config: dict[str, Any], inner: Any) -> str | None:
    """The token that ends documents: the config's ``eos_token_id`` (the first of a list), else ``<|endoftext|>``."""
    eos_id = eos_token_id(config)
    if eos_id is not None:
        token = inner.id_to_token(eos_id)
        if token is not None:
            return token
    return END_OF_TEXT if inner.token_to_id(END_OF_TEXT) is not None else None


def eos_token_id(config: dict[str, Any]) -> int | None:
    """The config's ``eos_token_id`` as one id (transformers allows a list: generation stops on any; we take the first)."""
    eos_id = config.get("eos_token_id")
    if isinstance(eos_id, list):
        eos_id = eos_id[0] if eos_id else None
    return eos_id if isinstance(eos_id, int) and not isinstance(eos_id, bool) and eos_id >= 0 else None


def no_tokenizer(config: dict[str, Any], *, vocab_size: int) -> NoTokenizer:
    """The record of a model without a tokenizer, keeping the config's end-of-text id when it is a valid one."""
    eos = eos_token_id(config)
    return NoTokenizer(vocab_size=vocab_size, eot_id=eos if eos is not None and eos < vocab_size else None)


def attach_tokenizer(
    checkpoint: str | Path,
    tokenizer: str | Path,
    *,
    eos_token: str | None = None,
    force: bool = False,
) -> BPETokenizer | ByteTokenizer:
    """Store ``tokenizer`` (a tokenizer.json or a folder holding one) in ``checkpoint``'s header, rewriting the
    file atomically (a complete new file renamed over the old).

    A checkpoint that already has a tokenizer keeps it unless ``force``: its model was trained on those ids.
    """
    checkpoint = Path(checkpoint)
    refuse_inputs([checkpoint], [tokenizer])  # the checkpoint is rewritten in place; the tokenizer is only read
    metadata = read_metadata(checkpoint)
    vocab_size = _vocab_size(checkpoint, metadata)
    kind = checkpoint_tokenizer(metadata, vocab_size=vocab_size, where=str(checkpoint), ids_only=True).kind
    if kind != "none" and not force:
        raise UserError(
            f"{checkpoint}: already has a {kind} tokenizer, the one its weights were trained with; pass --force to "
            "replace it anyway"
        )
    config = _json_object(metadata.get(CONFIG_KEY))
    found = load_tokenizer_json(tokenizer, config=config, vocab_size=vocab_size, eos_token=eos_token)
    tensors = read_tensors(checkpoint)
    # The imported tokenizer_config.json (chat template, special tokens) described the tokenizer replaced here.
    kept = {k: v for k, v in metadata.items() if k != TOKENIZER_CONFIG_KEY}
    with writing(checkpoint):
        write_safetensors_atomic(tensors, checkpoint, {**kept, METADATA_KEY: found.to_json()})
    return found


def _json_object(text: str | None) -> dict[str, Any]:
    try:
        data = json.loads(text) if text else {}
    except (json.JSONDecodeError, RecursionError):
        return {}  # only its eos_token_id is wanted; --eos-token covers a damaged copy
    return data if isinstance(data, dict) else {}


def _vocab_size(checkpoint: Path, metadata: dict[str, str]) -> int:
    model = _json_object(metadata.get("spec")).get("model")
    vocab = model.get("vocab_size") if isinstance(model, dict) else None
    if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab < 1:
        raise CheckpointError(f"{checkpoint}: the spec in its header has no valid model.vocab_size")
    return vocab


# -- export ---------------------------------------------------------------------------------

#: Token ids a transformers config and generation_config.json carry.
TOKEN_ID_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def special_token_ids(tokenizer: Any, *, vocab_size: int) -> dict[str, int]:
    """bos/eos/pad ids a stored tokenizer knows: its end-of-text id, and specformer's ``<|bos|>`` and
    ``<|pad|>`` (the byte tokenizer's fixed ids, or those tokens in a BPE vocabulary)."""
    if tokenizer is None:
        return {}
    inner = getattr(tokenizer, "inner", None)
    found = {"eos_token_id": getattr(tokenizer, "eot_id", None)}
    for field, attribute, token in (("bos_token_id", "bos_id", "<|bos|>"), ("pad_token_id", "pad_id", "<|pad|>")):
        value = getattr(tokenizer, attribute, None)
        if value is None and inner is not None:
            value = inner.token_to_id(token)
        found[field] = value
    return {k: v for k, v in found.items() if isinstance(v, int) and 0 <= v < vocab_size}


def tokenizer_config(inner: Any, ids: dict[str, Any], *, context_length: int) -> dict[str, Any]:
    """tokenizer_config.json for a tokenizer.json: the fast tokenizer class (transformers 4 and 5 load it from
    tokenizer.json alone) and the special tokens, so pipelines know where text ends and what pads a batch.
    ``inner`` needs only ``id_to_token`` (a ``tokenizers`` tokenizer has it)."""
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": context_length,
        "clean_up_tokenization_spaces": False,
    }
    for field in TOKEN_ID_FIELDS:
        value = ids.get(field)
        if isinstance(value, list):  # several end tokens (Llama 3): the tokenizer names the first
            value = value[0] if value else None
        token = inner.id_to_token(value) if isinstance(value, int) else None
        if token is not None:
            config[field.removesuffix("_id")] = token
    return config


__all__ = [
    "TOKEN_ID_FIELDS", "attach_tokenizer", "end_of_text", "eos_token_id", "load_tokenizer_json", "no_tokenizer",
    "special_token_ids", "tokenizer_config",
]
