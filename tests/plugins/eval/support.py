"""Small models and checkpoints the eval tests share, and a reference scorer written out token by token."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch

import specformer
from specformer.tokenizers.tokenizer import METADATA_KEY, ByteTokenizer
from fixtures.tiny import tiny_spec

BYTES = ByteTokenizer()

DOCUMENTS = [
    "def add(a, b):\n    return a + b\n" * 3,  # 105 bytes: several windows
    "short",
    "",  # empty: nothing to score, no bytes
    "na\u00efve caf\u00e9 \u2603 \u00fcber " * 4,  # multi-byte characters: bytes != characters
]


def byte_spec(**model_changes: Any) -> dict[str, Any]:
    """The shared tiny model over the byte tokenizer's 259 ids; context 32 so documents need several windows."""
    return tiny_spec(**{"vocab_size": 259, **model_changes})


def byte_model(*, seed: int = 0, **model_changes: Any) -> Any:
    model = specformer.build(byte_spec(**model_changes), seed=seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)  # away from the init so a misplaced weight shows
    return model.eval()


def save_with_tokenizer(model: Any, path: Path, tokenizer: Any = BYTES) -> Path:
    return specformer.save(model, path, metadata={METADATA_KEY: tokenizer.to_json()})


@torch.no_grad()
def reference_nll(model: Any, sequence: Sequence[int], *, context: int, stride: int) -> tuple[float, int]:
    """Summed NLL and count of ``sequence[1:]``, one window per forward, one token at a time.

    A window ends at target ``end`` (the first at ``context``, then ``stride`` further each
    time, clipped to the last target), reads the ``context`` tokens before it and scores the
    targets not scored before.
    """
    total, count = 0.0, 0
    last = len(sequence) - 1
    done = 0
    end = context
    while done < last:
        end = min(end, last)
        start = max(0, end - context)
        ids = torch.tensor([list(sequence[start:end])])
        logp = torch.log_softmax(model(ids)[0].double(), dim=-1)  # row i predicts sequence[start + i + 1]
        for target in range(done + 1, end + 1):
            total -= logp[target - 1 - start, sequence[target]].item()
            count += 1
        done = end
        end += stride
    return total, count
