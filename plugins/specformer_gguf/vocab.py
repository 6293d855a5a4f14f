"""A checkpoint's tokenizer as GGUF tokenizer metadata (llama.cpp's byte-level BPE, ``gpt2`` model).

specformer's tokenizers are both byte-level BPE: a trained one (ByteLevel pre-tokenizer with
GPT-2's split pattern, merges) and the byte tokenizer, which is the same construction with no
merges (:mod:`specformer.tokenizers.byte_file`: token ``i`` is byte ``i`` in GPT-2's
byte-to-character table). So one path writes both: the vocabulary in id order, the merges, added
special tokens as CONTROL tokens, and ids past the tokenizer's end (a padded embedding) as
unused placeholders, since llama.cpp wants one token per embedding row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import gguf

from specformer.errors import UserError
from specformer.tokenizers.byte_file import byte_tokenizer_json


#: The one merge a tokenizer with none (the byte tokenizer) is given: llama.cpp's gpt2 vocabulary refuses a file without
#: the merges key, and the gguf package cannot write an empty array. Its left side is a multi-character string that no
#: merge builds, and BPE starts from single characters, so it never applies: tokens stay one per byte.
NEVER_APPLIED_MERGE = "<|endoftext|> <|endoftext|>"


@dataclass(frozen=True)
class GgufVocab:
    tokens: list[str]
    types: list[int]  # gguf.TokenType values
    merges: list[str]  # "left right", GPT-2's notation
    pre: str  # llama.cpp's pre-tokenizer name


def tokenizer_json(tokenizer: Any) -> dict[str, Any]:
    """The tokenizer.json data of a checkpoint's tokenizer (the byte tokenizer's own construction for it)."""
    if getattr(tokenizer, "kind", None) == "byte":
        return byte_tokenizer_json()
    inner = getattr(tokenizer, "inner", None)
    if inner is None or not hasattr(inner, "to_str"):
        raise UserError("the checkpoint has no tokenizer GGUF can hold (only ids); attach one with "
                        "`specformer hf attach-tokenizer CHECKPOINT tokenizer.json` first")
    return json.loads(inner.to_str())


def gguf_vocab(data: dict[str, Any], *, n_rows: int) -> GgufVocab:
    """Tokens for ``n_rows`` embedding rows from tokenizer.json ``data``; UserError for a kind llama.cpp does not read."""
    model, pre = data.get("model") or {}, data.get("pre_tokenizer") or {}
    if model.get("type") != "BPE" or pre.get("type") != "ByteLevel" or data.get("normalizer") is not None:
        raise UserError(f"the checkpoint's tokenizer ({model.get('type')} model, {pre.get('type')} pre-tokenizer) is "
                        "not a plain byte-level BPE one; GGUF export writes only those (specformer's own tokenizers)")
    by_id: dict[int, str] = {i: t for t, i in model["vocab"].items()}
    special = set()
    for added in data.get("added_tokens") or []:
        by_id[added["id"]] = added["content"]
        if added.get("special"):
            special.add(added["id"])
    if max(by_id) >= n_rows:
        raise UserError(f"the tokenizer has ids up to {max(by_id)} but the model only {n_rows} embedding rows")
    tokens, types = [], []
    for i in range(n_rows):
        if i in by_id:
            tokens.append(by_id[i])
            types.append(int(gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL))
        else:
            tokens.append(f"[PAD{i}]")
            types.append(int(gguf.TokenType.UNUSED))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    if not merges:
        merges = [NEVER_APPLIED_MERGE]
    # llama.cpp's "gpt2" pre-tokenizer is GPT-2's split pattern, which ByteLevel applies by default (use_regex);
    # the byte tokenizer turns it off, which changes nothing with no merges to apply.
    return GgufVocab(tokens=tokens, types=types, merges=merges, pre="gpt2")
