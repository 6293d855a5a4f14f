"""The lightning indexer: which earlier keys each query reads (DeepSeek Sparse Attention, DeepSeek-V3.2)."""

from __future__ import annotations

from typing import Any, Iterator

import torch
from torch import Tensor, nn

from specformer.model.context import ForwardContext
from specformer.model.masks import MaskRule
from specformer.model.positional import PositionalScheme
from specformer_layers.attention.masking import dense_mask, inputs_of
from specformer_layers.attention.params import LightningIndexerParams


class LightningIndexer(nn.Module):
    """Scores every (query, earlier key) pair cheaply and keeps each query's ``topk`` best: :class:`LightningIndexerParams`.

    The attention that holds it hands over ``query_source`` (``query_dim`` channels per
    token: MLA's normalised query latent) and its positional scheme; the indexer keeps one
    key of ``head_dim`` channels per token, which the attention stores in its cache beside
    its own (:attr:`key_dim` more values per token).
    """

    Params = LightningIndexerParams

    def __init__(self, params: LightningIndexerParams, *, d_model: int, query_dim: int, positional_dim: int) -> None:
        super().__init__()
        params.check_positional(positional_dim)
        self.topk = params.topk
        self.n_heads = params.n_heads
        self.key_dim = params.head_dim
        self.positional_dim = positional_dim
        self.interleaved = params.interleaved
        self.block = params.block
        self.ties = params.ties
        self.scale = params.head_dim ** -0.5
        self.loss_coef = params.loss_coef
        # Set by the attention after a training forward that chose keys (Decoder.auxiliary_loss collects it).
        self.aux_loss: Tensor | None = None
        self.q_proj = nn.Linear(query_dim, params.n_heads * params.head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, params.head_dim, bias=False)
        self.k_norm = params.key_norm.make(dim=params.head_dim)
        self.weights_proj = nn.Linear(d_model, params.n_heads, bias=False)

    def keys(self, x: Tensor, positional: PositionalScheme, state: Any) -> Tensor:
        """The indexer key of every token ``(B, 1, T, head_dim)``, rotated (what the cache keeps)."""
        k = self.k_norm(self.k_proj(x))[:, None]  # (B, 1, T, D)
        return self._rotate(k, positional, state)

    def queries(self, x: Tensor, query_source: Tensor, positional: PositionalScheme,
                state: Any) -> tuple[Tensor, Tensor]:
        """Queries ``(B, T, n_heads, D)`` rotated, and head weights ``(B, T, n_heads)``, both float32."""
        B, T, _ = x.shape
        q = self.q_proj(query_source).view(B, T, self.n_heads, self.key_dim).transpose(1, 2)  # (B, Hi, T, D)
        q = self._rotate(q, positional, state).transpose(1, 2)  # (B, T, Hi, D)
        weights = self.weights_proj(x).float() * self.n_heads ** -0.5  # (B, T, Hi)
        return q.float(), weights

    def scores(self, q: Tensor, weights: Tensor, keys: Tensor) -> Tensor:
        """Index scores ``(B, Tq, S)`` of queries ``(B, Tq, Hi, D)`` and head weights ``(B, Tq, Hi)`` on ``keys``
        ``(B, 1, S, D)`` (:func:`index_scores`)."""
        return index_scores(q, weights, keys[:, 0].float(), scale=self.scale)

    @torch.no_grad()
    def selections(self, x: Tensor, query_source: Tensor, keys: Tensor, *, ctx: ForwardContext,
                   k_positions: Tensor, rule: MaskRule, positional: PositionalScheme,
                   state: Any) -> Iterator[tuple[slice, Tensor, Tensor]]:
        """Per block of queries: ``(rows, chosen, readable)``, both ``(B, rows, n)``, ``n`` at most ``topk``.

        ``chosen`` are the key slots each query reads, in slot order; ``readable`` is False
        where a chosen slot is one the mask rule forbids (a query with fewer than ``topk``
        allowed keys gets all of them, and forbidden slots to fill the row). Ties of the score
        at the cut are broken as :attr:`ties` says (:func:`top_slots`); with ``topk`` every
        block's row spans every key the forward may read, so the choice, like transformers',
        does not depend on the block.
        """
        q, weights = self.queries(x, query_source, positional, state)
        inputs = inputs_of(ctx, k_positions)
        T = x.shape[1]
        # torch.topk's choice among equal scores depends on the whole row: under `topk` every row is as long
        # as transformers' (every key any query of the forward may read), the part past a block's own keys
        # forbidden (-inf), as transformers masks it.
        row = None if self.ties == "first" else last_readable(dense_mask(inputs, rule)[:, 0])
        for start in range(0, T, self.block):
            rows = slice(start, min(start + self.block, T))
            allowed = dense_mask(inputs, rule, rows=rows)[:, 0]  # (B, rows, S)
            # Slots after the last one any row of the block may read are never chosen: left unscored
            # (without a cache, causality halves the work).
            span = last_readable(allowed)
            allowed = allowed[..., :span]
            scores = self.scores(q[:, rows], weights[:, rows], keys[:, :, :span]).masked_fill(~allowed, float("-inf"))
            if row is not None:
                scores = nn.functional.pad(scores, (0, row - span), value=float("-inf"))  # (B, rows, row)
                allowed = nn.functional.pad(allowed, (0, row - span), value=False)
            chosen = top_slots(scores, min(self.topk, scores.shape[-1]), ties=self.ties)  # (B, rows, n)
            yield rows, chosen, allowed.gather(-1, chosen)

    def alignment_loss(self, q: Tensor, weights: Tensor, keys: Tensor, *, chosen: Tensor, readable: Tensor,
                       attention: Tensor) -> Tensor:
        """``sum`` over this block's queries of ``KL(p || softmax(I))`` on their chosen keys.

        ``q``, ``weights``: :meth:`queries` of the block's rows (with gradients); ``keys``
        ``(B, 1, S, D)``; ``attention`` ``(B, rows, n)``: the attention's weights on the chosen
        keys summed over its heads (the target ``p`` once normalised; no gradient).
        """
        B, rows, n = chosen.shape
        picked = keys[:, 0].gather(1, chosen.reshape(B, rows * n, 1).expand(-1, -1, keys.shape[-1]))
        picked = picked.view(B, rows, n, -1).float()  # (B, rows, n, D)
        per_head = torch.relu(torch.einsum("bthd,btnd->bthn", q, picked) * self.scale)  # (B, rows, Hi, n)
        index = torch.einsum("bth,bthn->btn", weights, per_head)
        return index_kl(attention, index, readable).sum()

    def _rotate(self, x: Tensor, positional: PositionalScheme, state: Any) -> Tensor:
        """The first ``positional_dim`` channels turned by ``positional``, laid out as this indexer's pairs."""
        r = self.positional_dim
        if r == 0:
            return x
        rot, rest = x[..., :r], x[..., r:]
        scheme_interleaved = bool(getattr(positional, "interleaved", False))  # the rope's layout of its pairs
        if scheme_interleaved != self.interleaved:
            rot = _relayout(rot, to_interleaved=scheme_interleaved)
        rot = positional.rotate(rot, state)
        if scheme_interleaved != self.interleaved:
            rot = _relayout(rot, to_interleaved=self.interleaved)
        return torch.cat((rot, rest), dim=-1)

    def extra_repr(self) -> str:
        return (f"topk={self.topk}, n_heads={self.n_heads}, head_dim={self.key_dim}, "
                f"interleaved={self.interleaved}, block={self.block}, ties={self.ties}")

    def init_weights(self, *, std: float, residual_std: float) -> None:
        # Nothing it computes feeds the residual stream: every projection at std.
        for linear in (self.q_proj, self.k_proj, self.weights_proj):
            nn.init.normal_(linear.weight, std=std)


def index_scores(q: Tensor, weights: Tensor, keys: Tensor, *, scale: float) -> Tensor:
    """The lightning indexer's scores ``(B, Tq, S)``: ``sum_h w[t,h] relu(q[t,h] . k[s] * scale)``.

    ``q`` ``(B, Tq, Hi, D)``, ``weights`` ``(B, Tq, Hi)``, ``keys`` ``(B, S, D)``, one key per
    slot shared by the heads (DeepSeek-V3.2's indexer, and DeepSeek-V4's over pooled entries).
    """
    B, Tq, Hi, D = q.shape
    # One (Tq*Hi, D) x (D, S) product per row of the batch: the keys are shared, never copied per query.
    per_head = (q.reshape(B, Tq * Hi, D) @ keys.transpose(-2, -1)).view(B, Tq, Hi, -1)
    per_head = torch.relu_(per_head * scale)  # (B, Tq, Hi, S)
    return (weights[:, :, None, :] @ per_head).squeeze(-2)  # (B, Tq, S)


def index_kl(attention: Tensor, index: Tensor, keep: Tensor) -> Tensor:
    """Each query's ``KL(p || softmax(index))`` over the slots it keeps ``(...)``: the indexer's training signal.

    ``p`` is ``attention`` ``(..., n)`` (the attention's weights, summed over its heads)
    on the kept slots, normalised, without gradient: DeepSeek-V3.2's sparse training
    stage, which DeepSeek-V4 uses for its indexer too. A query that keeps nothing gives 0.
    """
    tiny = torch.finfo(torch.float32).tiny
    p = attention.detach().float().masked_fill(~keep, 0.0)
    p = p / p.sum(-1, keepdim=True).clamp_min(tiny)
    log_q = index.float().masked_fill(~keep, float("-inf")).log_softmax(dim=-1)
    return torch.where(keep & (p > 0), p * (p.clamp_min(tiny).log() - log_q), 0.0).sum(-1)


def last_readable(allowed: Tensor) -> int:
    """One past the last slot that any query of ``allowed`` ``(B, Tq, S)`` may read (a host sync: a length)."""
    return int(allowed.any(dim=1).any(dim=0).nonzero()[-1]) + 1


def top_slots(scores: Tensor, k: int, *, ties: str = "first") -> Tensor:
    """The ``k`` highest-scoring slots of each row ``(..., k)``, ascending.

    Ties at the cut: ``first`` takes the earliest slots, so the choice depends only on the
    scores, not on how long the row is; ``topk`` takes the slots ``torch.topk`` returns
    (the implementation's order of equal values, which depends on the row's length and
    the device: what transformers' indexers choose on the same row).
    """
    if k == scores.shape[-1]:
        return torch.arange(k, device=scores.device).expand(scores.shape)
    top = scores.topk(k, dim=-1)
    if ties == "topk":
        return top.indices.sort(dim=-1).values
    cut = top.values[..., -1:]  # (..., 1): the k-th best score
    # `first`: every slot above the cut, then as many slots equal to it as fill the row, earliest first.
    # No branch on whether a tie exists: asking would sync with the device on every decode step and
    # break a full-graph compile, and the counts below cost what the scores did. The positions of the
    # taken slots in their row come from a running count, so nothing is sorted.
    above = scores > cut
    at_cut = scores == cut
    room = k - above.sum(-1, keepdim=True)
    taken = above | (at_cut & (at_cut.cumsum(-1) <= room))  # exactly k per row
    place = torch.where(taken, taken.cumsum(-1) - 1, k)  # (..., S): each taken slot's rank, others to a spare column
    slots = torch.arange(scores.shape[-1], device=scores.device).expand_as(scores)
    out = torch.zeros(*scores.shape[:-1], k + 1, dtype=torch.long, device=scores.device)
    return out.scatter_(-1, place, slots)[..., :k]


def _relayout(x: Tensor, *, to_interleaved: bool) -> Tensor:
    """Rotary channels from halves ``(a0..an, b0..bn)`` to pairs ``(a0, b0, a1, b1, ...)`` or back."""
    if to_interleaved:
        return x.unflatten(-1, (2, -1)).transpose(-2, -1).flatten(-2)
    return x.unflatten(-1, (-1, 2)).transpose(-2, -1).flatten(-2)
