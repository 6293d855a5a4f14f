"""The vocabulary as llguidance reads it, built from a specformer tokenizer once and cached.

llguidance needs every token's bytes to know which tokens can extend the text a grammar
accepts. Both of specformer's text tokenizers are Hugging Face ``tokenizer.json`` files
underneath (the byte tokenizer as the no-merge BPE of :mod:`specformer.tokenizers.byte_file`),
and llguidance reads that file directly. Building takes up to a second for a large
vocabulary, so the result is kept per tokenizer object (weakly: it goes with the tokenizer),
per logits width and per set of end-of-sequence ids.
"""

from __future__ import annotations

import json
import threading
import weakref
from typing import Any, Sequence

from specformer.tokenizers.byte_file import byte_tokenizer_json
from specformer.tokenizers.tokenizer import NO_TOKENIZER_HINT

_cache: "weakref.WeakKeyDictionary[Any, dict[tuple[int, tuple[int, ...]], Any]]" = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def llguidance_module() -> Any:
    """The llguidance package, or a ValueError saying how to install it."""
    try:
        import llguidance  # late: an optional package, which only a constraint sampler needs
    except ImportError:
        raise ValueError("the constraint samplers (regex, choice, json_schema, grammar) need llguidance: "
                         "pip install 'specformer[structured]'") from None
    return llguidance


def grammar_tokenizer(tokenizer: Any, *, vocab_size: int, eos: Sequence[int], what: str) -> Any:
    """An ``llguidance.LLTokenizer`` for ``tokenizer`` over ``vocab_size`` logits, ending on ``eos``.

    ``vocab_size`` is the model's logits width (which may exceed the tokenizer's: padded
    embeddings; ids past the tokenizer are never allowed). ``what`` names the constraint in
    the one-line error for a missing tokenizer or end-of-sequence id.
    """
    if tokenizer is None or getattr(tokenizer, "kind", None) == "none":
        hint = NO_TOKENIZER_HINT if tokenizer is not None else "pass tokenizer= (the model's tokenizer) to generate()"
        raise ValueError(f"the {what} constraint reads the generated text, so it needs the model's tokenizer; {hint}")
    if not eos:
        raise ValueError(f"the {what} constraint ends the text with an end-of-sequence token, and none was given; "
                         f"pass eos_token_id to generate() (the tokenizer's end of text is {getattr(tokenizer, 'eot_id', None)}), "
                         f"or drop --ignore-eos on the command line")
    key = (int(vocab_size), tuple(sorted(set(int(e) for e in eos))))
    with _lock:
        built = _cache.setdefault(tokenizer, {})
        if key not in built:
            built[key] = _build(tokenizer, vocab_size=key[0], eos=list(key[1]))
        return built[key]


def _build(tokenizer: Any, *, vocab_size: int, eos: list[int]) -> Any:
    llguidance = llguidance_module()
    if tokenizer.kind == "byte":
        text = json.dumps(byte_tokenizer_json())
    elif tokenizer.kind == "bpe":
        text = tokenizer.inner.to_str()
    else:
        raise ValueError(f"the constraint samplers read byte and bpe tokenizers, not {tokenizer.kind!r}")
    if any(not 0 <= e < vocab_size for e in eos):
        raise ValueError(f"end-of-sequence ids {eos} must be below the vocabulary size {vocab_size}")
    return llguidance.LLTokenizer(text, n_vocab=vocab_size, eos_token=eos)
