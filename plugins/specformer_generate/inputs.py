"""Prompts as the decode loop needs them: one left-padded batch with absolute positions.

Prompts of different lengths are aligned on the right so every row's next token is in
the same column. Padding gets position -1: attention never reads a key at a negative
position (see ``specformer.model.masks``) and position embeddings clamp it, so a
padded row computes exactly what it would alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

#: What the model reads in a padding column (any valid id; its key is never attended to).
PAD_INPUT = 0


@dataclass
class PromptBatch:
    tokens: Tensor  # (B, T) ids the model reads; PAD_INPUT in padding columns
    positions: Tensor  # (B, T) absolute positions; -1 in padding columns
    lengths: list[int]  # real length of each prompt
    from_tensor: bool  # the caller gave a (B, T) tensor (so wants a tensor back)

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def width(self) -> int:
        return self.tokens.shape[1]

    def marked(self) -> Tensor:
        """``(B, T)`` ids with padding as -1, the form samplers read (negative ids are not tokens)."""
        return self.tokens.masked_fill(self.positions < 0, -1)

    def repeat_rows(self, n: int) -> "PromptBatch":
        """Each row ``n`` times in a row (beam search runs ``n`` beams per prompt)."""
        return PromptBatch(
            tokens=self.tokens.repeat_interleave(n, dim=0),
            positions=self.positions.repeat_interleave(n, dim=0),
            lengths=[length for length in self.lengths for _ in range(n)],
            from_tensor=self.from_tensor,
        )


def prompt_batch(input_ids: "Tensor | Sequence[Sequence[int]]", *, vocab_size: int, device: torch.device) -> PromptBatch:
    """Validate prompts (a ``(B, T)`` tensor or a list of token lists) and left-pad them."""
    if isinstance(input_ids, Tensor):
        if input_ids.dim() != 2:
            raise ValueError(
                f"input_ids must be a (batch, time) tensor or a list of token lists, got a tensor of shape "
                f"{tuple(input_ids.shape)}" + ("; use input_ids[None] for one prompt" if input_ids.dim() == 1 else "")
            )
        if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
            raise ValueError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
        if input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
            raise ValueError(f"input_ids must hold at least one prompt of at least one token, got shape {tuple(input_ids.shape)}")
        tokens = input_ids.to(device=device, dtype=torch.long)
        _check_ids(tokens, vocab_size)
        batch, width = tokens.shape
        positions = torch.arange(width, device=device).expand(batch, width).contiguous()
        return PromptBatch(tokens, positions, [width] * batch, from_tensor=True)

    prompts = [list(p) for p in _as_lists(input_ids)]
    width = max(len(p) for p in prompts)
    # Laid out on the host (whatever torch's default device is), then moved in one copy each.
    tokens = torch.full((len(prompts), width), PAD_INPUT, dtype=torch.long, device="cpu")
    positions = torch.full((len(prompts), width), -1, dtype=torch.long, device="cpu")
    for row, prompt in enumerate(prompts):
        pad = width - len(prompt)
        tokens[row, pad:] = torch.tensor(prompt, dtype=torch.long, device="cpu")
        positions[row, pad:] = torch.arange(len(prompt), device="cpu")
    _check_ids(tokens, vocab_size)
    return PromptBatch(tokens.to(device), positions.to(device), [len(p) for p in prompts], from_tensor=False)


def _as_lists(input_ids: object) -> list[list[int]]:
    if not isinstance(input_ids, Sequence) or isinstance(input_ids, (str, bytes)) or not input_ids:
        raise ValueError(f"input_ids must be a (batch, time) tensor or a non-empty list of token lists, got {input_ids!r:.80}")
    prompts = []
    for i, prompt in enumerate(input_ids):
        if isinstance(prompt, int) or not isinstance(prompt, (Sequence, Tensor)) or isinstance(prompt, (str, bytes)):
            raise ValueError(
                f"input_ids[{i}] must be a list of token ids, got {prompt!r:.80}; wrap a single prompt as [ids]"
            )
        ids = prompt.tolist() if isinstance(prompt, Tensor) else list(prompt)
        if not ids:
            raise ValueError(f"input_ids[{i}] is an empty prompt; every prompt needs at least one token")
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise ValueError(f"input_ids[{i}] must hold integer token ids, got {ids!r:.80}")
        prompts.append(ids)
    return prompts


def _check_ids(tokens: Tensor, vocab_size: int) -> None:
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(f"token id {bad} is outside the model's vocabulary [0, {vocab_size})")
