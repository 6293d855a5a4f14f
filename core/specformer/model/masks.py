"""Which keys each query may attend to: the rule, as data. Kernels evaluate it.

An attention layer's mask is the conjunction of a few facts, all named here and
nowhere else:

* **causal**: a key comes no later than its query. Without a cache (training, a
  prompt run whole) "later" is the token's *column* in its row, not its position
  value, so positions that restart per document can never reach a later token;
  with a cache, keys carry the absolute positions the cache stored and the query's
  position decides.
* **padding**: a key at a negative position is never read; a padding query (negative
  position) may read everything, so its row stays finite (its output is never used).
* **window** ``w``: the query reads at most the ``w`` latest keys (Mistral).
* **chunk** ``c``: the query reads only keys in its own block of ``c`` positions,
  ``position // c`` equal (Llama 4's local layers).
* **documents**: with ``document_ids`` ``(B, T)`` a query reads only keys of its own
  document (packed training).

The per-layer part (window, chunk) is a :class:`MaskRule`; the per-forward part
(positions, whether keys come from a cache, documents) is the
:class:`~specformer.model.context.ForwardContext`. Both are plain data: the attention
kernels (the layers plugin's ``specformer_layers.attention.masking``) evaluate the
rule, densely, per tile or per score, with one elementwise expression that every
kernel shares.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class MaskRule:
    """The per-layer part of a mask: a sliding window and/or a chunk size (None: not limited)."""

    window: int | None = None
    chunk: int | None = None


def check_document_ids(document_ids: Tensor, input_ids: Tensor, *, cache: object = None) -> None:
    """ValueError naming what is wrong unless ``document_ids`` fits a forward of ``input_ids``."""
    if cache is not None:
        raise ValueError("document_ids are for a forward without a cache (packed training); generation has one document")
    if tuple(document_ids.shape) != tuple(input_ids.shape):
        raise ValueError(f"document_ids must have the shape of input_ids {tuple(input_ids.shape)}, "
                         f"got {tuple(document_ids.shape)}")
    if document_ids.dtype.is_floating_point or document_ids.dtype.is_complex or document_ids.dtype == torch.bool:
        raise ValueError(f"document_ids must be an integer tensor, got {document_ids.dtype}")
    if document_ids.device != input_ids.device:
        raise ValueError(f"document_ids are on {document_ids.device}, input_ids on {input_ids.device}")


__all__ = ["MaskRule", "check_document_ids"]
