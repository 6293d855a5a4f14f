"""The byte tokenizer written as a Hugging Face ``tokenizer.json``, and recognised in one.

``specformer hf export`` writes it so that ``transformers.AutoTokenizer`` reads an exported
byte-level model as it is, and ``specformer hf import`` (or ``--tokenizer FILE``) turns it
back into :class:`~specformer.tokenizers.tokenizer.ByteTokenizer`.

The construction: a BPE model with no merges behind a ByteLevel pre-tokenizer. ByteLevel
turns every byte of the UTF-8 text into one printable character (GPT-2's byte-to-unicode
table); the vocabulary maps each of those characters to its byte's value, so the id of a
byte is the byte, and with no merges nothing is ever joined. No normaliser, no prefix
space, no post-processor: the text's bytes and nothing else, as specformer encodes. The
ByteLevel decoder maps the characters back to bytes and decodes the whole run with
replacement of invalid UTF-8, which replaces the same maximal invalid subparts by U+FFFD
as Python's ``errors="replace"``.

The special tokens (ids 256..258) are added special tokens, so a decode with
``skip_special_tokens=True`` drops them as specformer's decode does. specformer encodes
their strings as plain bytes; ``split_special_tokens`` in tokenizer_config.json makes
transformers do the same (the bare ``tokenizers`` library needs
``tokenizer.encode_special_tokens = True``, which tokenizer.json cannot record).
"""

from __future__ import annotations

from typing import Any

from specformer.tokenizers.tokenizer import SPECIAL_TOKENS


def byte_to_char() -> dict[int, str]:
    """GPT-2's table: printable Latin-1 bytes stand for themselves, the rest for the characters from U+0100 on."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


def _vocabulary() -> dict[str, int]:
    vocab = {char: byte for byte, char in byte_to_char().items()}
    vocab.update({token: 256 + i for i, token in enumerate(SPECIAL_TOKENS)})
    return vocab


_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}


def byte_tokenizer_json() -> dict[str, Any]:
    """The tokenizer.json (as data) that encodes and decodes as :class:`~specformer.tokenizers.tokenizer.ByteTokenizer`."""
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": 256 + i, "content": token, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, token in enumerate(SPECIAL_TOKENS)],
        "normalizer": None,
        "pre_tokenizer": dict(_BYTE_LEVEL),
        "post_processor": None,
        "decoder": dict(_BYTE_LEVEL),
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": _vocabulary(), "merges": []},
    }


#: tokenizer_config.json entries that make transformers encode special tokens' strings as bytes, as specformer does.
BYTE_TOKENIZER_SETTINGS = {"split_special_tokens": True}


def is_byte_tokenizer_json(data: Any) -> bool:
    """Whether a parsed tokenizer.json encodes and decodes exactly as the byte tokenizer.

    Checked on what changes ids, not on formatting or on fields a tokenizers version adds:
    no normaliser, a ByteLevel pre-tokenizer without a prefix space (splitting rules do not
    matter with no merges), a ByteLevel decoder, a post-processor that adds no token (none,
    or the one transformers writes when it saves the file again), a BPE model without
    merges whose vocabulary is exactly the byte table and the special tokens, and those
    special tokens as the only added ones.
    """
    if not isinstance(data, dict):
        return False
    model, pre, decoder = data.get("model"), data.get("pre_tokenizer"), data.get("decoder")
    if not all(isinstance(part, dict) for part in (model, pre, decoder)):
        return False
    if data.get("normalizer") is not None or not _adds_nothing(data.get("post_processor")):
        return False
    if pre.get("type") != "ByteLevel" or pre.get("add_prefix_space") or decoder.get("type") != "ByteLevel":
        return False
    if model.get("type") != "BPE" or model.get("merges") or model.get("byte_fallback"):
        return False
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix") or model.get("dropout"):
        return False
    if model.get("vocab") != _vocabulary():
        return False
    added = data.get("added_tokens") or []
    if not isinstance(added, list) or not all(isinstance(token, dict) for token in added):
        return False
    found = sorted(((token.get("id"), token.get("content")) for token in added), key=repr)
    return found == sorted(((256 + i, token) for i, token in enumerate(SPECIAL_TOKENS)), key=repr)


def _adds_nothing(post: Any) -> bool:
    """No post-processor, a ByteLevel one (offsets only), or a template of the text alone."""
    if post is None:
        return True
    if not isinstance(post, dict):
        return False
    if post.get("type") == "ByteLevel":
        return True
    single = post.get("single")
    return (post.get("type") == "TemplateProcessing" and isinstance(single, list) and len(single) == 1
            and isinstance(single[0], dict) and set(single[0]) == {"Sequence"})


__all__ = ["BYTE_TOKENIZER_SETTINGS", "byte_to_char", "byte_tokenizer_json", "is_byte_tokenizer_json"]
