"""OpenAI's ``logit_bias`` as a sampler step: a fixed amount added to chosen tokens' logits."""

from __future__ import annotations

import torch
from torch import Tensor


class LogitBias:
    """Add ``bias[token]`` to each listed token's logit: ``(B, V), (B, T) -> (B, V)``.

    +100 makes a token all but certain and -100 all but impossible (a model's logits spread
    over far less than 100); a value in between multiplies the token's odds by ``exp(value)``.
    """

    def __init__(self, *, bias: dict[int, float], vocab_size: int) -> None:
        bad = [token for token in bias if not 0 <= token < vocab_size]
        if bad:
            raise ValueError(f"logit_bias: token id {bad[0]} is outside the vocabulary (0..{vocab_size - 1})")
        self.bias = dict(bias)
        self._row = torch.zeros(vocab_size)  # (V,) the bias of every token, 0 for those not listed
        for token, value in self.bias.items():
            self._row[token] = value

    def __call__(self, logits: Tensor, input_ids: Tensor) -> Tensor:
        return logits + self._row.to(device=logits.device, dtype=logits.dtype)

    def __repr__(self) -> str:
        return f"logit_bias({len(self.bias)} tokens)"
