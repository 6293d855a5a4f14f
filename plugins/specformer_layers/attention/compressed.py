"""Compressed attention (DeepSeek-V4): a sliding window plus keys pooled over blocks, one shared key/value head."""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch import Tensor, nn

from specformer.model.attention import CacheSlots
from specformer.model.context import ForwardContext
from specformer.model.positional import PositionalScheme
from specformer.model.state import StateSlots
from specformer.model.parallel_plan import ParallelPlan, Split
from specformer_layers.attention.block_pooling import BlockPooler
from specformer_layers.attention.grouped_output import GroupedLowRankOutput
from specformer_layers.attention.indexer import index_kl, index_scores, top_slots
from specformer_layers.attention.params import CompressedAttentionParams
from specformer_layers.mixers.recurrent import with_state


class CompressedAttention(nn.Module):
    """Sliding-window attention that also reads pooled entries of earlier blocks (:class:`CompressedAttentionParams`)."""

    Params = CompressedAttentionParams

    def __init__(self, params: CompressedAttentionParams, *, d_model: int, context_length: int,
                 layer_index: int = 0) -> None:
        super().__init__()
        H, hd, rate = params.n_heads, params.head_dim, params.compress_rate
        self.n_heads, self.n_kv_heads, self.head_dim = H, 1, hd
        self.positional_dim = params.rope_dim  # the scheme turns the last rope_dim channels of each head
        self.rope_dim = params.rope_dim
        self.layer_index = layer_index
        self.local_window = params.window
        self.compress_rate = rate
        self.index_topk = params.index_topk
        self.index_ties = params.index_ties
        self.index_loss_coef = params.index_loss_coef
        # Set by a training forward with an indexer (Decoder.auxiliary_loss collects it).
        self.aux_loss: Tensor | None = None
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

        # What the cache keeps. Per token, the key (which is the value) of the window, in a ring of
        # ``window`` slots: its first channels as the cache's "key", the rest as its "value".
        # Per sequence, a state of fixed size: every entry the context can hold (one per block of
        # ``compress_rate`` tokens up to context_length, and the indexer's key of each) and the
        # tails, the projections of the blocks in progress.
        self.window: int | None = params.window
        self.cache_slots = CacheSlots(key_heads=1, key_dim=hd - hd // 2, value_heads=1, value_dim=hd // 2)
        self.max_entries = max(context_length // rate, 1) if rate is not None else 0
        if rate is not None:
            assert self.pooler is not None
            tensors = [("entries", (self.max_entries, hd)), ("tail", self.pooler.tail_shape)]
            if self.index_heads is not None:
                tensors += [("index_entries", (self.max_entries, self.index_head_dim)),
                            ("index_tail", self.index_pooler.tail_shape)]
            # The entries grow with the tokens: a cache that knows its length keeps only the rows it needs.
            per = (("entries", rate),) + ((("index_entries", rate),) if self.index_heads is not None else ())
            self.state_slots = StateSlots(tuple(tensors), per_tokens=per)
        self.uses_positions = True  # rotary over its window, though it keeps a state beside it
        # An inspector (specformer_eval.capture) sets this to receive the probabilities over the tokens
        # (B, H, T, S); it asks only layers without pooled entries (the others keep a state).
        self.observe_weights: Callable[[Tensor], None] | None = None

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
            parts.append(f"index_heads={self.index_heads}, index_topk={self.index_topk}, "
                         f"index_ties={self.index_ties}, index_loss_coef={self.index_loss_coef}")
        return ", ".join(parts)

    # -- forward --------------------------------------------------------------------------

    def parallel_plan(self) -> ParallelPlan:
        """Query heads over tp (their up-projection, sinks and a plain output); the one key/value head and the indexer replicated."""
        heads = (Split("tp", 0, self.n_heads, "heads"),)
        plan: dict[str, tuple[Split, ...]] = {"q_b.weight": heads, "sinks": heads}
        if isinstance(self.out, nn.Linear):  # the grouped low-rank output mixes heads in groups: replicated
            plan["out.weight"] = (Split("tp", 1, self.n_heads, "heads"),)
        return plan

    def take_tensor_parallel_share(self, mesh: object) -> None:
        """Refused: its plan is on paper only (``summary --parallel``) until its pooled entries and indexer are split."""
        raise ValueError("tensor parallelism does not split compressed attention in training yet "
                         "(its split is planned on paper only: specformer summary --parallel)")

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        B, T, _ = x.shape
        H, hd = self.n_heads, self.head_dim
        if ctx.document_ids is not None:
            raise ValueError("compressed attention pools blocks across the whole row; it does not read packed documents")
        positional, state = ctx.positional_for(self.layer_index), ctx.positional_state_for(self.layer_index)
        if type(positional).attention_bias is not PositionalScheme.attention_bias:
            raise ValueError(f"compressed attention turns keys with a rotary scheme (or none); "
                             f"{type(positional).__name__} biases scores instead")
        if getattr(getattr(positional, "scaling", None), "length_dependent", False):
            # Entries and the output are turned at positions other than this forward's, which a
            # scheme whose angles follow the length seen so far would turn differently.
            raise ValueError("compressed attention turns entries at their blocks' positions and the output back by the "
                             "query's; a rope scaling whose frequencies depend on the length (dynamic, longrope) cannot")

        def rotate(t: Tensor, positions: Tensor) -> Tensor:  # the last rope_dim channels, at ``positions`` (B, N)
            return self._rotate_tail(positional, t, positional.prepare(positions))

        q_latent = self.q_norm(self.q_a(x))  # (B, T, q_lora_rank)
        q = self.q_b(q_latent).view(B, T, H, hd).transpose(1, 2)  # (B, H, T, hd)
        q = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + self.eps)  # weightless, per head
        q = self._rotate_tail(positional, q, state)
        kv = self._rotate_tail(positional, self.kv_norm(self.kv(x))[:, None], state)  # (B, 1, T, hd)
        q_pos = ctx.positions
        if ctx.cache is not None:
            half = hd - hd // 2
            first, rest, k_positions = ctx.cache.update(self.layer_index, kv[..., :half], kv[..., half:], q_pos)
            kv = torch.cat((first, rest), dim=-1)
        else:
            k_positions = q_pos
        seen = (k_positions[:, None, :] >= 0) & (k_positions[:, None, :] <= q_pos[:, :, None])  # (B, T, S)
        keys, masks = [kv[:, 0]], [seen & (q_pos[:, :, None] - k_positions[:, None, :] < self.local_window)]
        if self.pooler is not None:
            entries, ends, index_keys = self._entries(x, ctx, rotate)  # (B, N, hd), (B, N), (B, N, index_head_dim)
            readable = (ends[:, None, :] >= 0) & (ends[:, None, :] <= q_pos[:, :, None])  # (B, T, N): block complete
            if self.index_heads is not None:
                assert index_keys is not None
                # The indexer reads its inputs detached: the language-model loss never reaches it (its
                # choice is discrete); it learns from its own loss below.
                index_q = self.index_q(q_latent.detach()).view(B, T, self.index_heads, self.index_head_dim)
                index_q = self._rotate_tail(positional, index_q.transpose(1, 2), state)  # (B, n_index, T, dim)
                chosen, index_scores = self._indexed(x.detach(), index_q, index_keys, readable)
                readable = readable & chosen
            keys.append(entries)
            masks.append(readable)
        values = torch.cat(keys, dim=1)[:, None]  # (B, 1, S + N, hd): the keys are the values
        mask = torch.cat(masks, dim=2)[:, None]  # (B, 1, T, S + N)
        scores = torch.matmul(q, values.transpose(-1, -2)) * self.scale  # (B, H, T, S + N)
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        if self.sinks is not None:
            sink = self.sinks.to(scores.dtype).view(1, H, 1, 1).expand(B, H, T, 1)
            probs = torch.cat((scores, sink), dim=-1).softmax(dim=-1)[..., :-1]
        else:
            probs = scores.softmax(dim=-1)
        if self.observe_weights is not None:
            self.observe_weights(probs[..., : kv.shape[2]].float())
        self.aux_loss = None
        if self.index_heads is not None and self.training and torch.is_grad_enabled() and self.index_loss_coef:
            self.aux_loss = self.index_loss_coef * self._index_loss(probs[..., kv.shape[2]:], index_scores, readable)
        y = torch.matmul(probs.to(values.dtype), values)  # (B, H, T, hd)
        # The value carries its key's rotation; turning the output back by the query's angle leaves
        # each key's contribution depending on its distance to the query only.
        y = rotate(y, -q_pos.clamp(min=0))
        return self.out(y.transpose(1, 2).reshape(B, T, H * hd))

    def _rotate_tail(self, positional: Any, t: Tensor, state: Any) -> Tensor:
        turned = positional.rotate(t[..., -self.rope_dim:], state)
        return torch.cat((t[..., : -self.rope_dim], turned), dim=-1)

    def _indexed(self, x: Tensor, index_q: Tensor, index_keys: Tensor, readable: Tensor) -> tuple[Tensor, Tensor]:
        """The lightning indexer: the ``index_topk`` readable entries each query scores highest ``(B, T, N)``,
        and the scores ``(B, T, N)`` (``-inf`` where not readable).

        Ties (frequent: the ReLU puts every head of a query at 0 for many entries) are broken
        as ``index_ties`` says (:func:`top_slots`): ``first`` gives them to the earlier entry,
        whatever the number of entries or queries in the forward, so the cache chooses what
        recomputing chooses; ``topk`` to what ``torch.topk`` returns over the row, as transformers.
        """
        # Scored in float32 at least, as transformers does: a lower precision could reorder close entries.
        wide = torch.promote_types(index_q.dtype, torch.float32)
        weights = self.index_weights(x).to(wide) * self.index_heads ** -0.5  # (B, T, n_index)
        total = index_scores(index_q.to(wide).transpose(1, 2), weights, index_keys.to(wide),
                             scale=self.index_head_dim ** -0.5)  # (B, T, N)
        total = total.masked_fill(~readable, float("-inf"))
        top = top_slots(total, min(self.index_topk, total.shape[-1]), ties=self.index_ties)  # (B, T, k)
        return torch.zeros_like(readable).scatter(-1, top, True), total

    def _index_loss(self, on_entries: Tensor, scores: Tensor, chosen: Tensor) -> Tensor:
        """KL(attention over each query's chosen entries, summed over heads || softmax of their index scores).

        The indexer's training signal (DeepSeek-V3.2's sparse stage, as DeepSeek-V4 trains its
        indexer): the attention's weights ``(B, H, T, N)`` are the target, detached; averaged over
        the queries that chose any entry.
        """
        per_query = index_kl(on_entries.sum(dim=1), scores, chosen)  # (B, T)
        counted = chosen.any(dim=-1)  # (B, T)
        return (per_query * counted).sum() / counted.sum().clamp_min(1)

    def _entries(self, x: Tensor, ctx: ForwardContext, rotate: Any) -> tuple[Tensor, Tensor, Tensor | None]:
        """The entries this forward's queries may read, in block order, with the position completing each.

        Without a cache: the entries pooled from this forward's tokens. With one: the row's
        entries so far (the state) with this forward's completed blocks written in, and the
        state brought up to date.
        """
        if ctx.cache is None:
            return self._pooled(x, ctx.positions, rotate, held=None, keep_steps=False)[0]
        # The state is read and written as every recurrent mixer does (with_state), but only that
        # part of their forward is shared: the window goes through the per-token cache beside it,
        # packed documents are refused rather than cut apart (blocks pool across the whole row), and
        # without a cache the entries still come from this forward's blocks.
        return with_state(ctx, self, lambda held, keep_steps: self._pooled(x, ctx.positions, rotate, held=held,
                                                                            keep_steps=keep_steps))

    def _pooled(self, x: Tensor, positions: Tensor, rotate: Any, *, held: dict[str, Tensor] | None, keep_steps: bool
                ) -> tuple[tuple[Tensor, Tensor, Tensor | None], dict[str, Tensor], dict[str, Tensor] | None]:
        """(entries, the position completing each, the indexer's entries), the state after, steps if kept.

        ``held``: the state before this forward (None: no cache, the entries are this forward's only).
        """
        rate = self.compress_rate
        assert rate is not None and self.pooler is not None
        names = [("entries", "tail", self.pooler)]
        if self.index_heads is not None:
            names.append(("index_entries", "index_tail", self.index_pooler))
        found: dict[str, Tensor] = {}
        states: dict[str, Tensor] = {}
        steps: dict[str, Tensor] = {}
        has = (positions >= 0).any(dim=1)  # (B,) a row with no token here keeps its state
        for entries_name, tail_name, pooler in names:
            source = x.detach() if pooler is not self.pooler else x  # the indexer learns from its own loss only
            blocks = pooler.blocks(pooler.project(source), positions, None if held is None else held[tail_name])
            pooled, index = pooler.entries(blocks, rotate=rotate)  # (B, n, dim), (B, n) block indices
            complete = (index + 1) * rate - 1 <= blocks.last[:, None]  # (B, n)
            if held is None:
                found[entries_name] = pooled
                ends = torch.where(complete, (index + 1) * rate - 1, -1)  # (B, n)
                continue
            before = held[entries_name].clone()  # the cache's own tensor, about to be overwritten
            N = before.shape[1]  # as many as the context holds, or as the cache's length needs
            if bool((complete & (index >= N)).any()):
                raise ValueError(f"the cache keeps {N} compressed entries per sequence (one per {rate} tokens of its "
                                 f"length, at most context_length // {rate}); position {int(blocks.last.max())} is past them")
            spare = torch.cat((before, before[:, :1] * 0), dim=1)  # a last row for the blocks not written
            where = torch.where(complete, index.clamp(max=N - 1), N)  # (B, n)
            written = spare.scatter(1, where[..., None].expand_as(pooled), pooled)[:, :-1]  # (B, N, dim)
            found[entries_name] = written
            states[entries_name] = written
            tail_before = held[tail_name].clone()
            states[tail_name] = torch.where(has[:, None, None], pooler.tails(blocks, blocks.last[:, None])[:, 0],
                                            tail_before)
            if keep_steps:
                # After each token: its position, or for padding before any token the position before the first.
                upto = positions.cummax(dim=1).values
                upto = torch.where(upto >= 0, upto, blocks.first[:, None] - 1)
                steps[tail_name] = torch.where(has[:, None, None, None], pooler.tails(blocks, upto), tail_before[:, None])
                # An entry is written once, by the token that completes its block; after a rollback
                # to before that token it is never read until that block completes again, and is
                # then written anew, so every step may hold the entries as they are after the forward.
                steps[entries_name] = written[:, None].expand(-1, positions.shape[1], -1, -1)
        if held is not None:
            N = found["entries"].shape[1]
            ends = (torch.arange(N, device=positions.device) + 1) * rate - 1
            ends = ends.expand(positions.shape[0], N)
        # Entries no query here can read are masked (not cut: the sizes stay known from the shapes).
        return (found["entries"], ends, found.get("index_entries")), states, steps if keep_steps else None
