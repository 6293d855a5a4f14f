"""A checkpoint and the tokenizer its text must be encoded with, for evaluation and inspection.

The tokenizer is the one stored in the checkpoint's header (``specformer train`` and
``specformer hf import`` store it), or a ``tokenizer.json`` given with ``--tokenizer``.
A checkpoint imported without a tokenizer records that it has none, and is refused with
how to attach one. An older checkpoint with no tokenizer entry at all is read with the
byte tokenizer only when its vocabulary is the byte tokenizer's (as ``specformer
generate`` does); any other vocabulary would turn text into ids that mean nothing to
the model, so that is refused too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

import specformer
from specformer.checkpoint import read_metadata
from specformer.errors import UserError
from specformer.tokenizer import (
    METADATA_KEY,
    NO_TOKENIZER_HINT,
    ByteTokenizer,
    Tokenizer,
    tokenizer_from_metadata,
)
from specformer.devices import parse_device
from specformer_train.tokenization import load_tokenizer_file


def load_model(checkpoint: str | Path, *, device: str | torch.device = "cpu") -> Any:
    """The model of ``checkpoint`` on ``device``, in evaluation mode."""
    device = parse_device(str(device)) if isinstance(device, str) else device
    return specformer.load(checkpoint, device=device).eval()


def checkpoint_tokenizer(checkpoint: str | Path, *, vocab_size: int, tokenizer: str | Path | None = None) -> Tokenizer:
    """The tokenizer for ``checkpoint`` (see the module doc); UserError when there is none to use."""
    if tokenizer is not None:
        path = Path(tokenizer)
        if not path.is_file():
            raise UserError(f"--tokenizer {str(path)!r}: no such file; give a tokenizer.json "
                            "(Hugging Face, or the JSON specformer writes)")
        return load_tokenizer_file(path)
    metadata = read_metadata(checkpoint)
    byte_vocab = ByteTokenizer().vocab_size
    if METADATA_KEY not in metadata and vocab_size != byte_vocab:
        raise UserError(
            f"{checkpoint}: the checkpoint stores no tokenizer, and its vocabulary of {vocab_size} ids is not the "
            f"byte tokenizer's ({byte_vocab}), so text cannot be encoded for it; pass --tokenizer path/to/tokenizer.json"
        )
    found = tokenizer_from_metadata(metadata)
    if getattr(found, "kind", None) == "none":  # recorded by an import from a folder without tokenizer.json
        raise UserError(f"{checkpoint}: {NO_TOKENIZER_HINT}; or pass --tokenizer path/to/tokenizer.json")
    return found
