"""RWKV's token shift: each token sees the previous token's input, padding skipped (:func:`token_shift`).

RWKV's time and channel mixing both interpolate a token's input with the previous one's; in a
cached decode the previous input is a state the layer keeps (one ``d_model`` vector per sequence).
"""

from __future__ import annotations

import torch
from torch import Tensor


def token_shift(x: Tensor, previous: Tensor | None, padding: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """Each token's previous input, the last real input and that after each token.

    ``x`` ``(B, T, D)``; ``previous`` ``(B, D)``: the input before this forward (None: zeros, a
    fresh row); ``padding`` ``(B,)``: padding tokens opening each row (None: none), which the
    shift skips (a row's first real token sees ``previous``). Returns the shifted input
    ``(B, T, D)``, the input after the forward ``(B, D)`` and after each token ``(B, T, D)``
    (for a padding token, ``previous``).
    """
    batch, length, _ = x.shape
    previous = x.new_zeros(batch, x.shape[-1]) if previous is None else previous.to(x.dtype)
    shifted = torch.cat((previous[:, None], x[:, :-1]), dim=1)  # (B, T, D)
    if padding is None:
        return shifted, (x[:, -1] if length else previous), x
    index = torch.arange(length, device=x.device)[None, :]  # (1, T)
    first = (index == padding[:, None])[..., None]  # (B, T, 1): each row's first real token
    real = (index >= padding[:, None])[..., None]  # (B, T, 1)
    shifted = torch.where(first, previous[:, None], shifted)
    after = torch.where(real, x, previous[:, None])  # (B, T, D)
    return shifted, (after[:, -1] if length else previous), after


__all__ = ["token_shift"]
