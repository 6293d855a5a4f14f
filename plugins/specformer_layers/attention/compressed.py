"""Compressed attention (DeepSeek-V4): a sliding window plus keys pooled over blocks, one shared key/value head."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from specformer.model.attention import CacheSlots
from specformer.model.context import ForwardContext
from specformer.model.positional import PositionalScheme
from specformer.model.state import StateSlots, recurrent_cache
from specformer_layers.attention.block_pooling import BlockPooler, Blocks
from specformer_layers.attention.grouped_output import GroupedLowRankOutput
from specformer_layers.attention.params import CompressedAttentionParams


class CompressedAttention(nn.Module):
    """Sliding-window attention that also reads pooled entries of earlier blocks (:class:`CompressedAttentionParams`)."""

    Params = CompressedAttentionParams

    def __init__(self, params: CompressedAttentionParams, *, d_model: int, layer_index: int = 0) -> None:
        super().__init__()
        H, hd, rate = params.n_heads, params.head_dim, params.compress_rate
        self.n_heads, self.n_kv_heads, self.head_dim = H, 1, hd
        self.positional_dim = params.rope_dim  # the scheme turns the last rope_dim channels of each head
        self.rope_dim = params.rope_dim
        self.layer_index = layer_index
        self.local_window = params.window
        self.compress_rate = rate
        self.index_topk = params.index_topk
        self.eps = params.eps
        self.scale = 1.0 / math.sqrt(hd)
        make_norm = lambda dim: params.norm.make(dim=dim)  # noqa: E731

        self.q_a = nn.Linear(d_model, params.q_lora_rank, bias=False)
        self.q_norm = make_norm(params.q_lora_rank)
        self.q_b = nn.Linear(params.q_lora_rank, H * hd, bias=False)
        self.kv = nn.Linear(d_model, hd, bias=False)
        self.kv_norm = make_norm(hd)
        self.sinks = nn.Parameter(torch.zeros(H)) if params.sinks else None
        if params.out_groups is None:
            self.out: nn.Module = nn.Linear(H * hd, d_model, bias=False)
        else:
            assert params.out_rank is not None
            self.out = GroupedLowRankOutput(in_features=H * hd, groups=params.out_groups, rank=params.out_rank,
                                            d_model=d_model)
        self.pooler = None if rate is None else BlockPooler(d_model=d_model, dim=hd, rate=rate, overlap=params.overlap,
                                                            make_norm=make_norm)
        self.index_heads = params.index_heads
        self.index_head_dim = params.index_head_dim if params.index_heads is not None else 0
        if params.index_heads is not None:
            assert rate is not None
            self.index_pooler = BlockPooler(d_model=d_model, dim=params.index_head_dim, rate=rate, overlap=params.overlap,
                                            make_norm=make_norm)
            self.index_q = nn.Linear(params.q_lora_rank, params.index_heads * params.index_head_dim, bias=False)
            self.index_weights = nn.Linear(d_model, params.index_heads, bias=False)

        # What the cache keeps. Per token: its key (which is its value) and, beside it, the entry
        # of the block that token completes (and the indexer's key for it), zeros for the other
        # tokens: an entry is then read exactly when the token that completed it is, so the
        # cache's positions, padding, beams and rollback cover the entries too. The blocks in
        # progress are a per-sequence state (the tail). Entries need the whole history, so the
        # cache may drop no column (window None); without compression the layer is plain
        # sliding-window attention and the cache keeps a ring of its window.
        if rate is None:
            self.window: int | None = params.window
            self.cache_slots = CacheSlots(key_heads=1, key_dim=hd, value_heads=1, value_dim=hd)
        else:
            self.window = None
            self.cache_slots = CacheSlots(key_heads=1, key_dim=hd, value_heads=1, value_dim=hd + self.index_head_dim)
            tails = [("tail", self.pooler.tail_shape)]
            if self.index_heads is not None:
                tails.append(("index_tail", self.index_pooler.tail_shape))
            self.state_slots = StateSlots(tuple(tails))

    def init_weights(self, *, std: float, residual_std: float) -> None:
        linears = [m for name, m in self.named_modules() if isinstance(m, nn.Linear) and not name.startswith("out")]
        for linear in linears:
            nn.init.normal_(linear.weight, std=std)
        for pooler in (self.pooler, getattr(self, "index_pooler", None)):
            if pooler is not None:
                nn.init.zeros_(pooler.slot_bias)
        if self.sinks is not None:
            nn.init.zeros_(self.sinks)
        if isinstance(self.out, GroupedLowRankOutput):
            self.out.init_weights(std=std, residual_std=residual_std)
        else:
            nn.init.normal_(self.out.weight, std=residual_std)  # feeds the residual stream

    def extra_repr(self) -> str:
        parts = [f"n_heads={self.n_heads}", f"head_dim={self.head_dim}", f"rope_dim={self.rope_dim}",
                 f"window={self.local_window}", f"compress_rate={self.compress_rate}", f"eps={self.eps}"]
        if self.index_heads is not None:
            parts.append(f"index_heads={self.index_heads}, index_topk={self.index_topk}")
        return ", ".join(parts)

    # -- forward --------------------------------------------------------------------------

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        B, T, _ = x.shape
        H, hd = self.n_heads, self.head_dim
        if ctx.document_ids is not None:
            raise ValueError("compressed attention pools blocks across the whole row; it does not read packed documents")
        positional, state = ctx.positional_for(self.layer_index), ctx.positional_state_for(self.layer_index)
        if type(positional).attention_bias is not PositionalScheme.attention_bias:
            raise ValueError(f"compressed attention turns keys with a rotary scheme (or none); "
                             f"{type(positional).__name__} biases scores instead")

        def rotate(t: Tensor, positions: Tensor) -> Tensor:  # the last rope_dim channels, at ``positions`` (B, N)
            turned = positional.rotate(t[..., -self.rope_dim:], positional.prepare(positions))
            return torch.cat((t[..., : -self.rope_dim], turned), dim=-1)

        q_latent = self.q_norm(self.q_a(x))  # (B, T, q_lora_rank)
        q = self.q_b(q_latent).view(B, T, H, hd).transpose(1, 2)  # (B, H, T, hd)
        q = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + self.eps)  # weightless, per head
        q = self._rotate_tail(positional, q, state)
        kv = self._rotate_tail(positional, self.kv_norm(self.kv(x))[:, None], state)  # (B, 1, T, hd)

        entry_slots, selected_from = None, None
        if self.pooler is not None:
            entry_slots = self._entry_slots(x, ctx, rotate)  # (B, 1, T, hd + index_head_dim)
        if ctx.cache is not None:
            keys, slots, k_positions = ctx.cache.update(self.layer_index, kv, entry_slots if entry_slots is not None else kv,
                                                        ctx.positions)
            if entry_slots is not None and self.pooler is not None:
                self._write_tails(ctx)
        else:
            keys, slots, k_positions = kv, entry_slots, ctx.positions
        q_pos = ctx.positions
        S = keys.shape[2]
        seen = (k_positions[:, None, :] >= 0) & (k_positions[:, None, :] <= q_pos[:, :, None])  # (B, T, S)
        local = seen & (q_pos[:, :, None] - k_positions[:, None, :] < self.local_window)
        parts, masks = [keys[:, 0]], [local]
        if self.pooler is not None:
            assert slots is not None
            rate = self.compress_rate
            entries = slots[:, 0, :, :hd]  # (B, S, hd)
            readable = seen & (k_positions[:, None, :] % rate == rate - 1)  # the tokens that completed an entry
            if self.index_heads is not None:
                index_q = self.index_q(q_latent).view(B, T, self.index_heads, self.index_head_dim).transpose(1, 2)
                index_q = self._rotate_tail(positional, index_q, state)  # (B, n_index, T, index_head_dim)
                readable = readable & self._indexed(x, index_q, slots[:, 0, :, hd:], readable, k_positions)
            parts.append(entries)
            masks.append(readable)
        values = torch.cat(parts, dim=1)[:, None]  # (B, 1, S', hd): the keys are the values
        mask = torch.cat(masks, dim=2)[:, None]  # (B, 1, T, S')
        scores = torch.matmul(q, values.transpose(-1, -2)) * self.scale  # (B, H, T, S')
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        if self.sinks is not None:
            sink = self.sinks.to(scores.dtype).view(1, H, 1, 1).expand(B, H, T, 1)
            probs = torch.cat((scores, sink), dim=-1).softmax(dim=-1)[..., :-1]
        else:
            probs = scores.softmax(dim=-1)
        y = torch.matmul(probs.to(values.dtype), values)  # (B, H, T, hd)
        # The value carries its key's rotation; turning the output back by the query's angle leaves
        # each key's contribution depending on its distance to the query only.
        y = rotate(y, -q_pos.clamp(min=0))
        return self.out(y.transpose(1, 2).reshape(B, T, H * hd))

    def _rotate_tail(self, positional: Any, t: Tensor, state: Any) -> Tensor:
        turned = positional.rotate(t[..., -self.rope_dim:], state)
        return torch.cat((t[..., : -self.rope_dim], turned), dim=-1)

    def _indexed(self, x: Tensor, index_q: Tensor, index_keys: Tensor, readable: Tensor, k_positions: Tensor) -> Tensor:
        """The lightning indexer: the ``index_topk`` readable entries each query scores highest ``(B, T, S)``."""
        # Scored in float32 at least, as transformers does: a lower precision could reorder close entries.
        wide = torch.promote_types(index_q.dtype, torch.float32)
        index_q, index_keys, x = index_q.to(wide), index_keys.to(wide), x.to(wide)
        scores = torch.relu(torch.matmul(index_q, index_keys[:, None].transpose(-1, -2)))  # (B, n_index, T, S)
        scores = scores * self.index_head_dim ** -0.5
        weights = self.index_weights(x.to(self.index_weights.weight.dtype)).to(wide) * self.index_heads ** -0.5
        total = (scores * weights.transpose(1, 2)[..., None]).sum(dim=1)  # (B, T, S)
        total = total.masked_fill(~readable, float("-inf"))
        # Ranked with the entries laid out by block, as transformers lays them out, so that ties
        # (frequent: the ReLU puts every head of a query at 0 for many entries) fall where its
        # top-k puts them.
        rate = self.compress_rate
        entry = (k_positions >= 0) & (k_positions % rate == rate - 1)  # (B, S) slots holding an entry
        block = torch.where(entry, torch.div(k_positions, rate, rounding_mode="floor"), 0)  # (B, S)
        n = max(int(k_positions.max()) + 1, rate) // rate
        by_block = total.new_full((*total.shape[:2], n + 1), float("-inf"))
        slot_block = torch.where(entry, block, n)[:, None].expand_as(total)  # non-entries to a spare column
        by_block = by_block.scatter(-1, slot_block, total)[..., :n]  # (B, T, n)
        top = by_block.topk(min(self.index_topk, n), dim=-1).indices  # (B, T, k)
        chosen = torch.zeros_like(by_block, dtype=torch.bool).scatter(-1, top, True)  # (B, T, n)
        return chosen.gather(-1, block.clamp(max=n - 1)[:, None].expand_as(total)) & entry[:, None]

    def _entry_slots(self, x: Tensor, ctx: ForwardContext, rotate) -> Tensor:
        """Per token of this forward: the entry it completes (and the indexer's), else zeros ``(B, 1, T, width)``."""
        cached = ctx.cache is not None
        tails = recurrent_cache(ctx.cache, self).read_state(self.layer_index, ctx.positions) if cached else {}
        poolers = [("tail", self.pooler)] + ([("index_tail", self.index_pooler)] if self.index_heads is not None else [])
        self._pending: list[tuple[str, BlockPooler, Blocks, Tensor | None]] = []
        slots = []
        positions = ctx.positions
        rate = self.compress_rate
        for name, pooler in poolers:
            blocks = pooler.blocks(pooler.project(x), positions, tails.get(name))
            entries, _ = pooler.entries(blocks, rotate=rotate)  # (B, n-1, dim)
            completes = (positions >= 0) & (positions % rate == rate - 1)  # (B, T)
            which = (torch.div(positions, rate, rounding_mode="floor") - blocks.base[:, None] - 1).clamp(min=0)
            which = which.clamp(max=entries.shape[1] - 1)
            picked = entries.gather(1, which[..., None].expand(-1, -1, entries.shape[-1]))  # (B, T, dim)
            slots.append(picked * completes[..., None])
            self._pending.append((name, pooler, blocks, tails.get(name)))
        return torch.cat(slots, dim=-1)[:, None]

    def _write_tails(self, ctx: ForwardContext) -> None:
        """Store the blocks in progress after this forward (and after each token, for a rollback)."""
        cache = recurrent_cache(ctx.cache, self)
        positions = ctx.positions
        states, steps = {}, {}
        has = (positions >= 0).any(dim=1)[:, None, None]  # a row with no token here keeps its tail
        for name, pooler, blocks, before in self._pending:
            assert before is not None
            before = before.clone()  # the cache's own tensor, about to be overwritten
            states[name] = torch.where(has, pooler.tails(blocks, blocks.last[:, None])[:, 0], before)  # (B, 2*rate, C)
            if cache.keep_steps:
                # After each token: its position, or for padding before any token the position before the first.
                upto = positions.cummax(dim=1).values
                upto = torch.where(upto >= 0, upto, blocks.first[:, None] - 1)
                steps[name] = torch.where(has[..., None], pooler.tails(blocks, upto), before[:, None])
        self._pending = []
        cache.write_state(self.layer_index, states, steps=steps if cache.keep_steps else None)
