"""The logit lens (nostalgebraist, 2020): read every layer's residual stream as if it were the last.

Each stream in :attr:`Capture.residual` goes through the model's own final norm and LM
head (:meth:`specformer.Decoder.head_logits`), giving a next-token distribution per
layer and position. Early layers tend to predict the current token back, later ones
the next token; :func:`lens_agreement` measures both per layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from specformer_eval.capturing import Capture, capture


@dataclass(frozen=True)
class Lens:
    """Top-``k`` tokens and their probabilities per layer and position.

    ``ids`` and ``probs`` are ``(n_layers + 1, B, T, k)``: layer 0 reads the embeddings,
    the last entry the final stream (the model's own prediction).
    """

    ids: Tensor
    probs: Tensor


def logit_lens(model: Any, residual: Capture | list[Tensor], *, k: int = 5) -> Lens:
    """The logit lens over every captured layer (see the module doc); probabilities in float32."""
    streams = residual.residual if isinstance(residual, Capture) else residual
    if not streams:
        raise ValueError("no residual stream captured: run a forward inside `with capture(model) as cap:` first")
    if k < 1 or k > model.vocab_size:
        raise ValueError(f"k must be between 1 and the vocabulary size {model.vocab_size}, got {k}")
    ids, probs = [], []
    with torch.inference_mode():
        for stream in streams:
            p = torch.softmax(model.head_logits(stream).float(), dim=-1)  # (B, T, V)
            top = p.topk(k, dim=-1)
            ids.append(top.indices)
            probs.append(top.values)
    return Lens(ids=torch.stack(ids), probs=torch.stack(probs))


def lens_of(model: Any, input_ids: Tensor, *, k: int = 5) -> tuple[Lens, Capture]:
    """Run ``model`` on ``input_ids`` ``(B, T)`` with the residual stream captured; its lens and the capture."""
    with torch.inference_mode(), capture(model) as cap:
        model(input_ids)
    return logit_lens(model, cap, k=k), cap


def lens_agreement(lens: Lens, input_ids: Tensor) -> tuple[Tensor, Tensor]:
    """Per layer, the share of positions whose top token is the current input token, and the share
    whose top token is the next input token (the last position has no next token and is left out
    of the second). Both ``(n_layers + 1,)``, averaged over the batch."""
    top = lens.ids[..., 0]  # (L + 1, B, T)
    current = (top == input_ids[None]).float().mean(dim=(1, 2))
    if input_ids.shape[1] < 2:
        return current, torch.full_like(current, float("nan"))
    following = (top[:, :, :-1] == input_ids[None, :, 1:]).float().mean(dim=(1, 2))
    return current, following
