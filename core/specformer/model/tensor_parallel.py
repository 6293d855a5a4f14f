"""Tensor parallelism declared by components: the contract and the one style fused projections need.

A component takes part in tensor parallelism (TP) by defining

    def tensor_parallel(self, tp: int) -> dict[str, ParallelStyle]: ...

which checks that it can be split ``tp`` ways (a ``ValueError`` naming the limit if not),
switches its forward to its local share (its heads, its hidden channels) and returns the
plan for its submodules, keyed by their names relative to it
(``torch.distributed.tensor.parallel.parallelize_module`` applies it). A component
without the method is replicated: every process holds and computes it whole.

Specformer fuses projections (attention's ``qkv`` holds rows ``[q; k; v]``, the gated
FFN's ``gate_up`` rows ``[gate; up]``), so a plain column split would hand the first
process all the queries and the second the keys and values. :class:`FusedColwiseParallel`
splits each part on its own: process ``r`` holds ``[q_r; k_r; v_r]``. The parameter is a
DTensor sharded on rows whose logical (gathered) order is therefore rank-major;
:func:`row_order` records the permutation so that gathered weights are put back in the
module's own order before they are saved (:func:`restore_row_order`).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import ColwiseParallel

#: The attribute a fused projection carries after :class:`FusedColwiseParallel`: gathered row i is real row order[i].
ROW_ORDER = "_tp_row_order"


def rank_major_order(parts: Sequence[int], tp: int) -> Tensor:
    """The real row of each gathered row: ranks' slices ``[part0_r; part1_r; ...]`` one after another."""
    starts = [sum(parts[:i]) for i in range(len(parts))]
    order = []
    for rank in range(tp):
        for start, size in zip(starts, parts):
            share = size // tp
            order.extend(range(start + rank * share, start + (rank + 1) * share))
    return torch.tensor(order, dtype=torch.long)


class FusedColwiseParallel(ColwiseParallel):
    """Column-wise parallel for a Linear whose output rows are several parts laid end to end.

    ``parts``: the row count of each part (e.g. ``(H*hd, KV*hd, KV*hd)``); each must divide by
    the mesh size. The local output is ``[part0_r, part1_r, ...]`` on the last dim.
    """

    def __init__(self, parts: Sequence[int]) -> None:
        super().__init__()
        self.parts = tuple(parts)

    def _partition_linear_fn(self, name, module, device_mesh):
        tp, rank = device_mesh.size(), device_mesh.get_local_rank()
        if any(size % tp for size in self.parts):
            raise ValueError(f"{name or 'module'}: the parts {list(self.parts)} do not all divide by tp={tp}")
        order = rank_major_order(self.parts, tp)
        share = len(order) // tp
        mine = order[rank * share:(rank + 1) * share]
        for pname, param in list(module.named_parameters(recurse=False)):
            local = param.detach()[mine].clone()
            dparam = DTensor.from_local(local, device_mesh, [Shard(0)], run_check=False)
            module.register_parameter(pname, nn.Parameter(dparam, requires_grad=param.requires_grad))
        setattr(module, ROW_ORDER, order)


def fused_row_orders(model: nn.Module) -> dict[str, Tensor]:
    """``{parameter name: gathered-to-real row order}`` of every fused projection's parameters."""
    orders = {}
    for mname, module in model.named_modules():
        order = getattr(module, ROW_ORDER, None)
        if order is None:
            continue
        for pname, _ in module.named_parameters(recurse=False):
            orders[f"{mname}.{pname}" if mname else pname] = order
    return orders


def restore_row_order(tensor: Tensor, order: Tensor) -> Tensor:
    """A gathered (rank-major) tensor of a fused projection back in the module's own row order."""
    real = torch.empty_like(tensor)
    real[order.to(tensor.device)] = tensor
    return real


def put_in_rank_order(tensor: Tensor, order: Tensor) -> Tensor:
    """The inverse of :func:`restore_row_order`: a tensor in the module's order laid out rank-major."""
    return tensor[order.to(tensor.device)]
