"""The block-pooled indexer: which blocks of keys each query reads (Kolibri 1.1's sparse attention)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from specformer.model.context import ForwardContext
from specformer.model.masks import MaskRule
from specformer_layers.attention.block_pooled_params import BlockPooledIndexerParams
from specformer_layers.attention.indexer import top_slots
from specformer_layers.attention.masking import dense_mask, inputs_of


class BlockPooledIndexer(nn.Module):
    """Scores mean-pooled blocks of the attention's own keys against its queries: :class:`BlockPooledIndexerParams`.

    Weightless. The attention that holds it calls :meth:`select` with its queries and keys
    (as it reads them, the cache's included) and reads the chosen keys through a mask.
    """

    Params = BlockPooledIndexerParams

    def __init__(self, params: BlockPooledIndexerParams, *, d_model: int, query_dim: int, positional_dim: int) -> None:
        super().__init__()
        self.block_size = params.block_size
        self.topk = params.topk
        self.sink_blocks = params.sink_blocks
        self.local_blocks = params.local_blocks
        self.n_heads = params.n_heads
        self.block = params.block
        self.keys_read = params.keys_read()

    def check_heads(self, *, n_heads: int, n_kv_heads: int) -> None:
        """ValueError when more query heads score than key head 0 has."""
        if self.n_heads is not None and self.n_heads > n_heads // n_kv_heads:
            raise ValueError(f"the block_pooled indexer's n_heads ({self.n_heads}) scores with the query heads of key "
                             f"head 0, of which there are {n_heads // n_kv_heads} (n_heads / n_kv_heads)")

    @torch.no_grad()
    def select(self, q: Tensor, k: Tensor, *, ctx: ForwardContext, k_positions: Tensor, rule: MaskRule) -> Tensor:
        """Boolean ``(B, 1, Tq, S)``: the keys each query reads, within what ``rule`` allows.

        ``q`` ``(B, H, Tq, hd)`` and ``k`` ``(B, KV, S, hd)``: the attention's, rotated. Rows of
        padding (negative positions) keep what the rule allows.
        """
        B, H, T, hd = q.shape
        KV = k.shape[1]
        scorers = self.n_heads or H // KV
        bs = self.block_size
        inputs = inputs_of(ctx, k_positions)
        # Blocks by position: key s is in block k_positions[s] // bs (padding, at negative positions, never read).
        key_block = torch.div(k_positions.clamp_min(0), bs, rounding_mode="floor")  # (B, S)
        n_blocks = int(key_block.max()) + 1
        member = nn.functional.one_hot(key_block, n_blocks).float()  # (B, S, J)
        keys = k[:, 0].float()  # (B, S, hd): key head 0 summarises
        blocks = torch.arange(n_blocks, device=q.device)  # (J,)
        scale = hd ** -0.5 / scorers
        pieces = []
        for start in range(0, T, self.block):
            rows = slice(start, min(start + self.block, T))
            allowed = dense_mask(inputs, rule, rows=rows)[:, 0]  # (B, r, S)
            # Each query's block means, of the keys it may read (the others count as zero): (B, r, J, hd)
            means = torch.einsum("brs,bsj,bsd->brjd", allowed.float(), member, keys) / bs
            queries = q[:, :scorers, rows].float()  # (B, h, r, hd)
            scores = torch.einsum("bhrd,brjd->brhj", queries, means).relu_().sum(2) * scale  # (B, r, J)
            position = ctx.positions[:, rows, None]  # (B, r, 1)
            own = torch.div(position, bs, rounding_mode="floor")  # the query's block
            # Only blocks complete at the query are scored; its own unfinished block competes with 0; later ones never.
            scores = torch.where(blocks < torch.div(position + 1, bs, rounding_mode="floor"), scores, 0.0)
            seen = blocks <= own  # (B, r, J)
            forced = seen & ((blocks < self.sink_blocks) | (blocks > own - self.local_blocks))
            candidates = scores.masked_fill(~seen | forced, float("-inf"))
            k_top = min(self.topk, n_blocks)
            chosen = top_slots(candidates, k_top, ties="first")  # (B, r, k_top), earliest at ties
            picked = torch.zeros_like(forced).scatter_(-1, chosen, candidates.gather(-1, chosen) > float("-inf"))
            keep = (forced | picked).gather(-1, key_block[:, None, :].expand(-1, allowed.shape[1], -1))  # (B, r, S)
            keep = torch.where(position >= 0, keep & allowed, allowed)  # padding rows: as the rule allows
            pieces.append(keep)
        return torch.cat(pieces, dim=1)[:, None]

    def extra_repr(self) -> str:
        return (f"block_size={self.block_size}, topk={self.topk}, sink_blocks={self.sink_blocks}, "
                f"local_blocks={self.local_blocks}, n_heads={self.n_heads}")
