"""Tensor parallelism in training, derived from the components' :mod:`specformer.model.parallel_plan`.

A component declares once how its weights split (``parallel_plan()``: :class:`Split`
segments per parameter); ``specformer summary --parallel`` reads that declaration to plan
on paper, and the trainer reads the same one to split the weights (:func:`styles_from_plan`):

- a submodule's ``weight`` split on dim 0 (output rows) is column-wise parallel, each
  segment of a fused weight split on its own (:class:`FusedColwiseParallel`);
- a submodule's ``weight`` split on dim 1 (input columns) is row-wise parallel (partial
  outputs summed across processes; its bias added once);
- a parameter of the component itself split on dim 0 (attention sinks, one per head) is
  sharded (:class:`ShardOwnParameters`): the forward reads its share with ``.to_local()``.

The decoder's own embedding and output head split by vocabulary rows (the planner's
vocabulary-parallel plan): the embedding row-wise (each process looks up the tokens in its
rows, the partial embeddings summed), the head by :class:`VocabParallelHead`, whose logits
stay split by vocabulary for the loss.

Its forward must then compute on its share: a component whose forward depends on the
split sizes defines

    def take_tensor_parallel_share(self, mesh: DeviceMesh) -> None: ...

which switches its counts (heads, hidden channels) to one process' share of ``mesh.size()``,
or raises a ``ValueError`` naming what it cannot split yet; it is called before any weight
is cut. The mesh is there for an activation every process reads with its own heads only
(:func:`gradient_summed`).
Parameters named ``()`` or not at all are replicated; a component with no plan anywhere
above its weights is replicated whole.

Specformer fuses projections (attention's ``qkv`` holds rows ``[q; k; v]``, the gated
FFN's ``gate_up`` rows ``[gate; up]``), so a plain column split would hand the first
process all the queries and the second the keys and values. :class:`FusedColwiseParallel`
splits each part on its own: process ``r`` holds ``[q_r; k_r; v_r]``. The parameter is a
DTensor sharded on rows whose logical (gathered) order is therefore rank-major;
:func:`rank_major_order` records the permutation so that gathered weights are put back in
the module's own order before they are saved (:func:`restore_row_order`).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

from specformer.model.parallel_plan import ROW_ORDER, ParallelPlan, Split



def rank_major_order(parts: Sequence[int], tp: int, copied: Sequence[int | None] | None = None) -> Tensor:
    """The real row of each gathered row: ranks' slices ``[part0_r; part1_r; ...]`` one after another.

    ``copied``: per part, None when it is split ``tp`` ways, or its number of units (heads) when
    they are fewer than ``tp`` and copied: process ``r`` then holds unit ``r // (tp / units)``,
    so a unit's rows appear ``tp / units`` times in the order.
    """
    copied = copied if copied is not None else [None] * len(parts)
    starts = [sum(parts[:i]) for i in range(len(parts))]
    order = []
    for rank in range(tp):
        for start, size, units in zip(starts, parts, copied):
            if units is None:
                share = size // tp
                order.extend(range(start + rank * share, start + (rank + 1) * share))
            else:
                per_unit, unit = size // units, rank // (tp // units)
                order.extend(range(start + unit * per_unit, start + (unit + 1) * per_unit))
    return torch.tensor(order, dtype=torch.long)


class FusedColwiseParallel(ColwiseParallel):
    """Column-wise parallel for a Linear whose output rows are several parts laid end to end.

    ``parts``: the row count of each part (e.g. ``(H*hd, KV*hd, KV*hd)``); each must divide by
    the mesh size, or be one of ``copied`` (its units fewer than the mesh, each process keeping
    one, see :func:`rank_major_order`). The local output is ``[part0_r, part1_r, ...]`` on the
    last dim. A copied part makes the gathered parameter longer than the module's: each
    process' copy of a unit is a row block of its own, kept equal by summing their gradients
    (:func:`specformer_train.parallel.tensor.sum_copied_rows`).
    """

    def __init__(self, parts: Sequence[int], copied: Sequence[int | None] | None = None) -> None:
        super().__init__()
        self.parts = tuple(parts)
        self.copied = tuple(copied) if copied is not None else (None,) * len(self.parts)

    def _partition_linear_fn(self, name, module, device_mesh):
        tp, rank = device_mesh.size(), device_mesh.get_local_rank()
        if any(size % tp for size, units in zip(self.parts, self.copied) if units is None) or any(
                tp % units or size % units for size, units in zip(self.parts, self.copied) if units is not None):
            raise ValueError(f"{name or 'module'}: the parts {list(self.parts)} do not all divide by tp={tp}")
        order = rank_major_order(self.parts, tp, self.copied)
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
    """A gathered (rank-major) tensor of a fused projection back in the module's own row order (one of a copied
    unit's equal copies)."""
    real = tensor.new_empty((int(order.max()) + 1, *tensor.shape[1:]))
    real[order.to(tensor.device)] = tensor
    return real


def put_in_rank_order(tensor: Tensor, order: Tensor) -> Tensor:
    """The inverse of :func:`restore_row_order`: a tensor in the module's order laid out rank-major."""
    return tensor[order.to(tensor.device)]


class ShardOwnParameters(ParallelStyle):
    """Shard the named parameters of the module itself on dim 0 (e.g. one attention sink per head)."""

    def __init__(self, names: Sequence[str]) -> None:
        super().__init__()
        self.names = tuple(names)

    def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
        for name in self.names:
            param = getattr(module, name)
            sharded = distribute_tensor(param.detach(), device_mesh, [Shard(0)])
            module.register_parameter(name, nn.Parameter(sharded, requires_grad=param.requires_grad))
        return module


def styles_from_plan(module: nn.Module, plan: ParallelPlan, tp: int, *, where: str = "") -> dict[str, ParallelStyle]:
    """The ``parallelize_module`` plan that cuts ``module`` ``tp`` ways as its ``parallel_plan`` declares.

    Only the ``tp`` segments count (``ep`` is expert parallelism's), and only for parameters
    the module has (a plan may name optional ones: a gate, sinks). Segments declared
    ``copies_when_fewer`` with fewer units than ``tp`` (key/value heads) are copied, one unit
    per process, when their count divides ``tp``. A size that does not divide is a
    ``ValueError`` naming the parameter and the sizes.
    """
    present = {name for name, p in module.named_parameters() if p is not None}
    styles: dict[str, ParallelStyle] = {}
    own: list[str] = []
    for name, splits in plan.items():
        if name not in present:
            continue
        cut = tuple(s for s in splits if isinstance(s, Split) and s.axis == "tp")
        if not cut:
            continue
        for s in cut:
            _check_divides(s, tp, f"{where}{name}")
        owner, _, pname = name.rpartition(".")
        if not owner:  # the module's own parameter
            if cut[0].dim != 0:
                raise ValueError(f"{where}{name}: a module's own parameter splits on dim 0 only (declared dim {cut[0].dim})")
            own.append(name)
        elif pname == "weight":  # the bias follows its weight
            styles[owner] = _linear_style(cut, tp)
    if own:
        styles[""] = ShardOwnParameters(own)
    return styles


def _linear_style(cut: tuple[Split, ...], tp: int) -> ParallelStyle:
    if cut[0].dim == 1:
        return RowwiseParallel()
    copied = [s.units if s.units % tp else None for s in cut]  # fewer units than tp: copied (checked to divide tp)
    if len(cut) == 1 and cut[0].rows is None and copied[0] is None:
        return ColwiseParallel()
    if any(s.rows is None for s in cut):
        raise ValueError("a weight split in several segments (or copied) names each segment's rows")
    return FusedColwiseParallel([s.rows for s in cut], copied)


def _check_divides(split: Split, tp: int, name: str) -> None:
    if split.units % tp == 0:
        return
    if split.copies_when_fewer and tp % split.units == 0 and split.dim == 0:
        return  # fewer units than tp: each process keeps a copy of the one its share reads
    accepted = "divide by" if not split.copies_when_fewer else "divide by, or divide,"
    raise ValueError(f"{name}: tensor parallelism splits {split.what}, and {split.units} do not {accepted} tp={tp}")


def gradient_summed(x: Tensor, mesh: Any) -> Tensor:
    """``x`` itself, its gradient summed over ``mesh`` in backward.

    For an activation every process holds whole but reads with its own heads only (latent
    attention's shared rotary key): each process' gradient is a part of the whole. Megatron-LM
    calls this the copy into the tensor-parallel region.
    """
    return DTensor.from_local(x, mesh, [Replicate()], run_check=False).to_local(grad_placements=[Partial()])


#: Set on a :class:`VocabParallelHead`'s module while the loss reads its logits split by vocabulary.
SHARDED_LOGITS = "_tp_sharded_logits"


class VocabParallelHead(ColwiseParallel):
    """The output head split by vocabulary rows.

    While the module's :data:`SHARDED_LOGITS` attribute is set, its logits are a DTensor
    split on the vocabulary, for a cross-entropy under
    ``torch.distributed.tensor.parallel.loss_parallel`` that never gathers them; otherwise
    (sampling, a plugin reading the logits) they are gathered whole.
    """

    def __init__(self) -> None:
        super().__init__(output_layouts=Shard(-1), use_local_output=False)

    @staticmethod
    def _prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):
        return outputs if getattr(mod, SHARDED_LOGITS, False) else outputs.full_tensor()


def summed_over(x: Tensor, mesh: Any) -> Tensor:
    """``x`` summed over the processes of ``mesh``, without gradient (a target each process holds a part of)."""
    total = x.detach().clone()
    dist.all_reduce(total, group=mesh.get_group())
    return total
