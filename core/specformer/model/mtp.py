"""One multi-token prediction depth (DeepSeek-V3, arXiv:2412.19437 section 2.2).

Depth k reads, at position i, the hidden state ``h_i^{k-1}`` of the depth before it (depth 1:
the main model's last hidden state, before its final norm) and the embedding of the token
k positions ahead, ``Emb(t_{i+k})``. It norms each, concatenates them, projects the 2 x d_model
channels back to d_model, runs one block over the sequence (causal, as the main blocks) and
hands on ``h^k``; the Decoder applies this depth's final norm and the model's shared LM head
to ``h^k`` for the logits of ``t_{i+k+1}``.

The concatenation is ``[enorm(Emb(t_{i+k})); hnorm(h_i^{k-1})]``, the embedding first: the
paper writes the hidden state first (its equation 21), but the published checkpoints'
``eh_proj`` (DeepSeek-V3, GLM-4.5 and the inference engines that run them) read the
embedding in their first d_model columns.

The module knows no concrete component: the builder hands it its norms and its block.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn


class MTPDepth(nn.Module):
    """One prediction depth: ``enorm``, ``hnorm``, ``eh_proj`` (2 d_model -> d_model, no bias), ``block``, ``final_norm``,
    and ``positional``, the block's own positional scheme (None: the model's).

    ``forward(hidden, embedded, ctx)`` returns ``h^k`` ``(B, L, D)`` (before ``final_norm``), from
    ``hidden`` ``(B, L, D)`` (``h^{k-1}``) and ``embedded`` ``(B, L, D)`` (the embeddings k tokens ahead).
    ``residual`` expands the projected input to the model's residual stream and collapses the
    block's output (no-ops for a single stream), as the Decoder does around its blocks.
    """

    def __init__(self, *, d_model: int, embedding_norm: nn.Module, hidden_norm: nn.Module, block: nn.Module,
                 final_norm: nn.Module, positional: nn.Module | None = None) -> None:
        super().__init__()
        if d_model <= 0:
            raise ValueError(f"d_model must be positive, got {d_model}")
        self.d_model = d_model
        self.enorm = embedding_norm
        self.hnorm = hidden_norm
        self.eh_proj = nn.Linear(2 * d_model, d_model, bias=False)
        self.block = block
        self.final_norm = final_norm
        # The scheme inside the block's mixer when it is not the model's (model.mtp.block.positional, made as a
        # layer override's); None: the model-level scheme. The Decoder prepares it for the depth's rows.
        self.positional = positional

    @property
    def mixer(self) -> Any:
        """The token mixer of this depth's block (its public facts, as a main block's)."""
        return self.block.mixer

    def forward(self, hidden: Tensor, embedded: Tensor, ctx: Any, *, residual: Any) -> Tensor:
        joined = torch.cat([self.enorm(embedded), self.hnorm(hidden)], dim=-1)  # (B, L, 2D): embedding first
        x = residual.expand(self.eh_proj(joined))  # (B, L, D), or wider for a multi-stream residual
        return residual.collapse(self.block(x, ctx))  # (B, L, D)

    def init_weights(self, *, std: float, residual_std: float) -> None:
        # The projection feeds the block's input, not the residual stream's sum: the plain std.
        nn.init.normal_(self.eh_proj.weight, mean=0.0, std=std)


__all__ = ["MTPDepth"]
