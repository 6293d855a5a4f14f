"""Context parallelism: the processes of a group split each row's tokens and gather every layer's keys and values.

``train.parallel.cp: N`` puts N processes on the same rows; each takes ``1/N`` of every
row's tokens and runs the whole model on them, so activations (and the attention scores of
long sequences) shrink N-fold. Attention needs the keys and values of earlier tokens held
by the other processes: every attention layer hands its new keys and values to the
forward's cache (:class:`specformer.model.context.KVCache`), and :class:`GatheredKeys` is
such a cache that keeps nothing and returns the whole group's keys and values (with their
positions) gathered along the sequence. Every layer that reads keys through the cache
contract works unchanged (multi-head, grouped, windowed, chunked attention, sinks, MLA and
its indexer, cross-layer sharing); the attention mask comes from the positions, as in
cached decoding. This is Llama 3's all-gather context parallelism (Dubey et al. 2024,
arXiv:2407.21783, section 3.3.2), not a ring: simpler, and as fast while keys and values
are small beside the queries' work (grouped-query attention).

Causal attention gives late tokens more keys to read than early ones, so a row is cut into
``2N`` chunks and process ``r`` takes chunks ``r`` and ``2N-1-r``: each holds an early and a
late chunk, and the same work (:func:`positions_of`).

Gradients: each process' loss is the mean over its tokens, all processes of a group hold
as many, and data parallelism (DDP or FSDP over every process) averages gradients, so the
update is the one of the whole rows' mean loss. A gathered key's gradient is summed over
the group in backward (an all-reduce, then each process keeps its own slice: every backend
has all-reduce, gloo has no reduce-scatter).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from specformer.errors import UserError
from specformer.model.state import layer_state_slots, state_slots_of


def positions_of(length: int, *, cp: int, rank: int, device: torch.device | str = "cpu") -> Tensor:
    """The positions ``(length / cp,)`` process ``rank`` of a group of ``cp`` takes in a row: chunks ``rank`` and ``2cp-1-rank``
    of ``2cp`` equal chunks."""
    chunk = length // (2 * cp)
    first = torch.arange(rank * chunk, (rank + 1) * chunk, device=device)
    last = torch.arange((2 * cp - 1 - rank) * chunk, (2 * cp - rank) * chunk, device=device)
    return torch.cat((first, last))


class _GatherSequence(torch.autograd.Function):
    """All-gather along ``dim`` in the group's rank order; backward: the gradient summed over the group, this rank's slice."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, dim: int, group: Any) -> Tensor:
        ctx.dim, ctx.group = dim, group
        ctx.rank, ctx.size = dist.get_rank(group), x.shape[dim]
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad.narrow(ctx.dim, ctx.rank * ctx.size, ctx.size), None, None


def gather_sequence(x: Tensor, *, dim: int, group: Any) -> Tensor:
    """``x`` of every process of ``group`` laid end to end along ``dim`` (differentiable)."""
    return _GatherSequence.apply(x, dim, group)


class GatheredKeys:
    """A forward's cache that stores nothing: each layer's keys and values of the whole group, gathered.

    ``update`` receives this process' keys and values ``(B, n_kv, T/cp, d)`` and their
    positions ``(B, T/cp)`` and returns the group's ``(B, n_kv, T, d)`` and ``(B, T)``.
    """

    def __init__(self, group: Any) -> None:
        self.group = group

    def update(self, layer_index: int, key: Tensor, value: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        keys = gather_sequence(key, dim=2, group=self.group)  # (B, n_kv, T, d)
        values = gather_sequence(value, dim=2, group=self.group)  # (B, n_kv, T, d)
        parts = [torch.empty_like(positions) for _ in range(dist.get_world_size(self.group))]
        dist.all_gather(parts, positions.contiguous(), group=self.group)
        return keys, values, torch.cat(parts, dim=1)  # (B, T)


def check_context_parallel(model: nn.Module, *, cp: int, seq_len: int, documents: dict[str, bool],
                           masked_loss: bool) -> None:
    """One UserError naming what context parallelism cannot split in this run, if anything."""
    if seq_len % (2 * cp):
        raise UserError(f"train.parallel.cp {cp}: each row is cut into 2 x cp = {2 * cp} equal chunks, so "
                        f"train.seq_len ({seq_len}) must divide by {2 * cp}")
    for index, block in enumerate(model.blocks):
        attention = getattr(block, "mixer", None)
        if layer_state_slots(block) is not None:
            holder = attention if state_slots_of(attention) is not None else getattr(block, "ffn", None)
            raise UserError(f"train.parallel.cp {cp}: layer {index}'s {type(holder).__name__} keeps a state across "
                            f"tokens (a recurrent mixer, pooled entries, or a feed-forward's token shift), which context "
                            f"parallelism does not pass between processes; it splits attention that reads keys and values "
                            f"(attention, mla)")
    # Keys reach a query by position here (as in cached decoding), so positions restarting at each document
    # would let a query read a later document's earlier positions; document ids are not gathered yet.
    for setting in ("document_mask", "reset_positions"):
        if documents.get(setting):
            raise UserError(f"train.parallel.cp {cp}: train.{setting} is not split across processes yet; "
                            f"set train.{setting}: false")
    if masked_loss:
        raise UserError(f"train.parallel.cp {cp}: a loss mask (chat data) counts different tokens on each process, "
                        f"and context parallelism averages their means; train without cp")


__all__ = ["GatheredKeys", "check_context_parallel", "gather_sequence", "positions_of"]
