"""Choosing the tokenizer of a run: bytes, a BPE trained on the corpus, or a tokenizer.json.

The model's ``vocab_size`` must equal the tokenizer's, so ids and embedding rows agree
and ``specformer generate`` decodes with what the model was trained on. A BPE trained
here is cached (keyed by the corpus fingerprint and the vocabulary size), so a second
run does not train it again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from specformer.files.atomic import write_text_atomic
from specformer.errors import UserError
from specformer.tokenizers.tokenizer import SPECIAL_TOKENS, BPETokenizer, ByteTokenizer, Tokenizer
from specformer.tokenizers.choice import tokenizer_file

from specformer_text.errors import OutputError
from specformer_text.cache import cache_dir
from specformer_text.corpus import Corpus

BYTE_VOCAB = 256 + len(SPECIAL_TOKENS)


def make_tokenizer(choice: str, *, vocab_size: int, corpus: Corpus, cache: str | None = None) -> Tokenizer:
    """The tokenizer ``choice`` names (``byte``, ``bpe`` or a path), checked against ``vocab_size``."""
    if choice == "byte":
        tokenizer: Tokenizer = ByteTokenizer()
    elif choice == "bpe":
        tokenizer = trained_bpe(corpus, vocab_size=vocab_size, cache=cache)
    else:
        tokenizer = load_tokenizer_file(Path(choice))
    if tokenizer.vocab_size != vocab_size:
        raise UserError(
            f"train.tokenizer {choice!r} has {tokenizer.vocab_size} tokens but model.vocab_size is {vocab_size}; "
            f"set model.vocab_size to {tokenizer.vocab_size} (e.g. --set model.vocab_size={tokenizer.vocab_size})"
        )
    return tokenizer


def load_tokenizer_file(path: Path) -> Tokenizer:
    """A Hugging Face ``tokenizer.json`` (the byte tokenizer's, as ``hf export`` writes it, gives the byte
    tokenizer back), or the JSON specformer writes beside a checkpoint."""
    if not path.is_file():
        raise UserError(
            f"train.tokenizer {str(path)!r}: no such file; accepted: byte, bpe, or the path to a tokenizer.json"
        )
    return tokenizer_file(path, option="train.tokenizer")


def trained_bpe(corpus: Corpus, *, vocab_size: int, cache: str | None = None) -> BPETokenizer:
    """A byte-level BPE of ``vocab_size`` tokens (special tokens included) trained on ``corpus``."""
    if corpus.tokenized is not None:
        raise UserError("train.tokenizer 'bpe' needs text to train on, but --data is an already tokenized array; "
                        "give the tokenizer.json it was made with instead")
    if vocab_size < BYTE_VOCAB:
        raise UserError(f"a byte-level BPE needs model.vocab_size >= {BYTE_VOCAB} (256 bytes + "
                        f"{len(SPECIAL_TOKENS)} special tokens), got {vocab_size}")
    path = cache_dir(cache) / "tokenizers" / f"bpe-{vocab_size}-{corpus.fingerprint()[:24]}.json"
    if path.is_file():
        return BPETokenizer.from_file(str(path))
    tokenizer = train_bpe(corpus.documents(), vocab_size=vocab_size)
    if tokenizer.vocab_size != vocab_size:
        raise UserError(
            f"the corpus is too small to learn {vocab_size} BPE tokens (it yields {tokenizer.vocab_size}); "
            f"set model.vocab_size to {tokenizer.vocab_size} or train on more text"
        )
    try:
        write_text_atomic(path, tokenizer.inner.to_str())
    except OSError as exc:
        raise OutputError(f"could not write the trained tokenizer to {path}: {exc.strerror or exc}; free some space "
                          "or put the cache elsewhere with train.cache_dir or $SPECFORMER_CACHE") from None
    return tokenizer


def train_bpe(documents: Iterable[str], *, vocab_size: int) -> BPETokenizer:
    # late: tokenizers is needed only when a BPE tokenizer is trained
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    inner = HFTokenizer(models.BPE())
    inner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    inner.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    inner.train_from_iterator(documents, trainer=trainer)
    return BPETokenizer(inner)
