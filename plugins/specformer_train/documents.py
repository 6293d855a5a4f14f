"""Where the documents of a packed row begin: document ids and restarting positions.

A packed row is documents one after another, each followed by the end-of-text token
(see :mod:`specformer_train.data`). As an *input*, that token opens the next document:
it is exactly what a document run on its own starts with (generation starts from it
too), and its target is the next document's first token. So a document spans from its
end-of-text token up to the token before the next one, and the row's first tokens (cut
from the middle of some document) form a document of their own.

With ``train.document_mask`` each input token gets the id of its document (the count
of end-of-text tokens up to and including it) and attention stops at the boundaries;
with ``train.reset_positions`` positions count from 0 at each document's first token.
Both together make the per-token losses of a packed row those of each document
computed alone (``[eot, doc...]`` as inputs, ``[doc..., eot]`` as targets).

The layout is computed on the host from the numpy rows, before they go to the device,
so deciding that a batch needs no mask (no boundary after its first position) costs no
device synchronisation: such a batch is passed without ``document_ids`` and positions
and keeps the plain causal fast path.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DocumentLayout:
    """Per-token document ids and positions of a batch of inputs, or None where not wanted."""

    document_ids: np.ndarray | None  # (B, T) int64: 0 for the leading fragment, +1 at each end-of-text
    positions: np.ndarray | None  # (B, T) int64: 0 at each document's first token


def document_ids(inputs: np.ndarray, *, eot_id: int) -> np.ndarray:
    """``(B, T)`` ids: how many end-of-text tokens occur up to and including each position."""
    return np.cumsum(inputs == eot_id, axis=1, dtype=np.int64)  # (B, T)


def document_positions(inputs: np.ndarray, *, eot_id: int) -> np.ndarray:
    """``(B, T)`` positions restarting at 0 at every end-of-text token (the start of a document)."""
    batch, length = inputs.shape
    index = np.broadcast_to(np.arange(length, dtype=np.int64), (batch, length))  # (B, T)
    # The start of each token's document: the latest end-of-text index at or before it (0 before any).
    starts = np.maximum.accumulate(np.where(inputs == eot_id, index, 0), axis=1)  # (B, T)
    return index - starts


def needs_layout(inputs: np.ndarray, *, eot_id: int) -> bool:
    """Whether any row has a document boundary after its first token (otherwise plain causal is exact)."""
    return bool((inputs[:, 1:] == eot_id).any())


def document_layout(inputs: np.ndarray, *, eot_id: int, document_mask: bool, reset_positions: bool) -> DocumentLayout:
    """What the model is given for ``inputs`` ``(B, T)`` under the two settings (None: its defaults)."""
    if not (document_mask or reset_positions) or not needs_layout(inputs, eot_id=eot_id):
        return DocumentLayout(document_ids=None, positions=None)
    return DocumentLayout(
        document_ids=document_ids(inputs, eot_id=eot_id) if document_mask else None,
        positions=document_positions(inputs, eot_id=eot_id) if reset_positions else None,
    )


#: What a checkpoint from before these settings trained with (attention across documents, positions running on).
_BEFORE_RECORDING = {"document_mask": False, "reset_positions": False}


def document_settings(*, document_mask: bool | None, reset_positions: bool | None,
                      recorded: dict | None = None, resumed: bool = False) -> dict[str, bool]:
    """The two settings a run uses: the ones given, else the checkpoint's (resuming), else true.

    ``recorded`` is what the checkpoint's ``trainer.json`` holds under ``extra.documents``;
    a resumed checkpoint without it was trained before the settings existed, so it keeps
    training the way it did (both off).
    """
    given = {"document_mask": document_mask, "reset_positions": reset_positions}
    saved = recorded if isinstance(recorded, dict) else (_BEFORE_RECORDING if resumed else {})
    return {name: bool(value if value is not None else saved.get(name, True)) for name, value in given.items()}
