"""Tensor-parallel training: each block's components split as they declare (``train.parallel.tp``).

``torchrun --nproc_per_node=TP`` starts TP processes that read the same rows (or several
such groups, sharded across by FSDP2: :func:`specformer_train.parallel.parallelize.parallelize`); every
block component splits its weights across them as its ``parallel_plan`` declares
(:mod:`specformer.model.tensor_parallel`: attention by heads, FFNs by hidden channels), the
embedding and head by vocabulary rows where :func:`specformer.model.parallel_plan.vocabulary_split`
says (as ``specformer summary --parallel`` shows), and the rest (norms, a tied or padded
embedding and head, a component without a plan) is replicated: computed
whole on every process, with gradients that agree because the split layers all-reduce
their inputs' gradients.

The split parameters are DTensors, the replicated ones plain tensors, so the gradient norm
is taken here (:func:`clip_grad_norm`) rather than by torch's, which refuses the mix; and
gathered weights of fused projections are put back in their own row order before they are
saved (:func:`gathered_in_module_order`).
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import RowwiseParallel, loss_parallel, parallelize_module

from specformer.model.parallel_plan import VocabularySplit, declared_splits, plan_of, shared_weights, vocabulary_of
from specformer.model.tensor_parallel import (SHARDED_LOGITS, VocabParallelHead, fused_row_orders, put_in_rank_order,
                                              restore_row_order, styles_from_plan)
from specformer_train.parallel.placement import global_indices
from specformer_train.parallel.sequence import SequenceRowwise, apply_sequence_parallel, split_part_ids


def apply_tensor_parallel(model: nn.Module, *, mesh: DeviceMesh,
                          sequence: Any = None) -> tuple[str, tuple[str, ...]]:
    """Split every block component as its ``parallel_plan`` declares, across ``mesh`` (1-D, the tensor-parallel group);
    one warning names those that declare no plan. Returns what was split, in words, and the names of the
    parameters whose gradients are summed over the group (:class:`specformer.model.parallel_plan.Shared`).

    ``sequence`` (a :class:`specformer_train.parallel.sequence.SequenceSplit`): the stream is cut by sequence
    between sublayers, so only a block component that itself declares a tp split is split (a whole one computes
    on this process' tokens, its inner parts too), and its row-split output layer hands back this process'
    tokens (:mod:`specformer_train.parallel.sequence`).
    """
    tp = mesh.size()
    replicated: dict[str, list[str]] = {}
    split: dict[str, int] = {}
    summed: list[str] = []
    for index, block in enumerate(model.blocks):
        for name, component in block.named_children():
            where = f"blocks.{index}.{name}"
            summed += [f"{where}.{weight}" for weight in shared_weights(component, "tp")]
            walked = list(declared_splits(component))
            if not any(owner is not None for _, owner, _, _ in walked):
                if any(p.dim() >= 2 for p in component.parameters()):  # norms and residuals are replicated by design
                    replicated.setdefault(f"{type(component).__name__} (blocks.*.{name})", []).append(where)
                continue
            owners = {id(owner): owner for _, owner, _, splits in walked
                      if owner is not None and any(s.axis == "tp" for s in splits)}
            prefixes = {id(module): prefix for prefix, module in component.named_modules()}
            for owner in owners.values():
                at = f"{where}.{prefixes[id(owner)]}".rstrip(".")
                if sequence is not None and owner is not component:
                    continue  # inside a whole component, which computes on this process' tokens
                try:
                    styles = styles_from_plan(owner, plan_of(owner), tp, where=f"{at}.")
                    if sequence is not None:
                        styles = _sequence_styles(styles, sequence, RowwiseParallel)
                    take_share = getattr(owner, "take_tensor_parallel_share", None)
                    if take_share is not None:
                        take_share(mesh)
                except ValueError as exc:
                    raise ValueError(f"{at} ({type(owner).__name__}): {exc}") from None
                parallelize_module(owner, mesh, styles)
                split[type(owner).__name__] = split.get(type(owner).__name__, 0) + 1
    names = sorted(replicated)
    if names:
        warnings.warn(f"tensor parallelism: {', '.join(names)} declare(s) no parallel_plan and are replicated "
                      f"on every process", stacklevel=2)
    told = ", ".join(f"{count} {name}" for name, count in sorted(split.items())) or "nothing"
    vocabulary = _split_vocabulary(model, mesh)
    if sequence is not None:
        summed += apply_sequence_parallel(model, sequence, split_parts=split_part_ids(model))
        vocabulary += ", the stream cut by sequence between sublayers"
    return (f"tensor parallel {tp} ways: split {told}, {vocabulary}"
            + (f"; replicated {', '.join(names)}" if names else "")), tuple(dict.fromkeys(summed))


def _sequence_styles(styles: dict, sequence: Any, rowwise: type) -> dict:
    """A component's styles with its row-split output layers handing back this process' tokens; a ValueError when it
    has none (its output would stay whole while the stream is cut)."""
    if not any(type(style) is rowwise for style in styles.values()):
        raise ValueError("sequence parallelism needs a row-split output layer (a weight split on dim 1) to hand "
                         "back each process' tokens; its plan declares none")
    return {name: SequenceRowwise(sequence) if type(style) is rowwise else style for name, style in styles.items()}


def vocabulary_styles(model: nn.Module, tp: int) -> tuple[VocabularySplit, dict[str, Any]]:
    """How ``model``'s embedding and head split over ``tp`` processes, and the styles that split them ({}: whole).

    The decision is the planner's own (:func:`specformer.model.parallel_plan.vocabulary_split`), so
    ``specformer summary --parallel`` shows what training does.
    """
    vocabulary = vocabulary_of(model, tp)
    if not vocabulary.split:
        return vocabulary, {}
    return vocabulary, {"embedding": RowwiseParallel(input_layouts=Replicate()), "lm_head": VocabParallelHead()}


def _split_vocabulary(model: nn.Module, mesh: DeviceMesh) -> str:
    """Split the embedding and the output head by vocabulary rows where they can be; say which, in words."""
    vocabulary, styles = vocabulary_styles(model, mesh.size())
    if styles:
        parallelize_module(model, mesh, styles)
        setattr(model.lm_head, SHARDED_LOGITS, False)  # whole logits until the loss asks for them split
    return vocabulary.describe()


@contextlib.contextmanager
def vocabulary_parallel_loss(model: nn.Module) -> Iterator[None]:
    """Inside: the logits stay split by vocabulary and cross-entropy reads them so (forward and backward)."""
    head = getattr(model, "lm_head", None)
    if not hasattr(head, SHARDED_LOGITS):  # not split by vocabulary: plain logits, plain loss
        yield
        return
    setattr(head, SHARDED_LOGITS, True)
    try:
        with loss_parallel():
            yield
    finally:
        setattr(head, SHARDED_LOGITS, False)


def sum_shared_gradients(model: nn.Module, names: tuple[str, ...], mesh: DeviceMesh) -> None:
    """Sum over the tensor-parallel group the gradients of the weights each process applied to its share only.

    Under FSDP2 a gradient is this process' data-parallel shard, the same rows on every
    process of the group, so the shards are summed alike.
    """
    parameters = dict(model.named_parameters())
    for name in names:
        grad = parameters[name].grad
        if grad is not None:
            dist.all_reduce(grad.to_local() if isinstance(grad, DTensor) else grad, group=mesh.get_group())


def copied_rows(model: nn.Module) -> dict[str, Tensor]:
    """``{parameter name: gathered-to-real row order}`` of the fused parameters holding copied units (key/value heads
    fewer than tp): their orders name some real rows more than once."""
    return {name: order for name, order in fused_row_orders(model).items() if len(order) > int(order.max()) + 1}


def sum_copied_rows(model: nn.Module, copies: dict[str, Tensor], mesh: DeviceMesh) -> dict[int, Tensor]:
    """Sum over the tensor-parallel group the gradients of every copy of a copied unit, so the copies stay equal.

    Each process' copy of a key/value head has the gradient of its own query heads only;
    the head's gradient is their sum, which every copy then takes. Returns, for the gradient
    norm, each such parameter's weight per local row: 1 / the number of copies of its row.
    Works on any layout of the gradient (FSDP2's shards of the tensor-parallel rows too): the
    rows are placed by their index in the whole parameter.
    """
    parameters = dict(model.named_parameters())
    weights: dict[int, Tensor] = {}
    for name, order in copies.items():
        param = parameters[name]
        if param.grad is None:
            continue
        indices, local = global_indices(param.grad, order)
        rows = indices[0].to(local.device)  # the real row of each local row
        counts = torch.bincount(order, minlength=int(order.max()) + 1).to(local.device)
        copied = counts[rows] > 1
        slots = torch.full_like(counts, -1)  # each copied real row's place in the buffer
        shared_rows = (counts > 1).nonzero().squeeze(1)
        slots[shared_rows] = torch.arange(len(shared_rows), device=local.device)
        buffer = local.new_zeros((len(shared_rows), *local.shape[1:]))
        buffer.index_add_(0, slots[rows[copied]], local[copied])
        dist.all_reduce(buffer, group=mesh.get_group())
        local[copied] = buffer[slots[rows[copied]]]
        weights[id(param)] = 1.0 / counts[rows].float()
    return weights


def clip_grad_norm(parameters: list[nn.Parameter], max_norm: float, *,
                   split_over: dict[int, object] | None = None, row_weights: dict[int, Tensor] | None = None) -> Tensor:
    """Scale gradients so their global norm is at most ``max_norm``; return the norm before.

    A DTensor gradient's squares are summed over the mesh dimensions it is sharded on (tensor
    parallel, and FSDP's data parallel beside it); a plain gradient of a parameter in
    ``split_over`` (``{id(parameter): process group}``: expert stacks, each process holding
    other experts) over that group; any other plain (replicated) one is the same on every
    process and counts once. ``row_weights`` (``{id(parameter): weight per local row}``) counts
    rows held by several processes (copied key/value heads) once in all.
    """
    split_over, row_weights = split_over or {}, row_weights or {}
    by_groups: dict[tuple, list[Tensor]] = {}  # the process groups to sum over -> local gradients
    weighted: dict[int, Tensor] = {}  # id(local gradient) -> its rows' weights
    for p in parameters:
        g = p.grad
        if g is None:
            continue
        if isinstance(g, DTensor):
            # not is_shard(): FSDP's _StridedShard (data parallel over tensor-parallel rows) is not a Shard
            dims = tuple(i for i, placement in enumerate(g.placements) if not placement.is_replicate())
            local = g.to_local()
            by_groups.setdefault(tuple(g.device_mesh.get_group(dim) for dim in dims), []).append(local)
        else:
            group = split_over.get(id(p))
            local = g
            by_groups.setdefault(() if group is None else (group,), []).append(g)
        if id(p) in row_weights:
            weighted[id(local)] = row_weights[id(p)]
    device = next(iter(by_groups.values()))[0].device
    total = torch.zeros((), device=device, dtype=torch.float32)
    for groups, tensors in by_groups.items():
        squares = torch.stack([_squares(t, weighted.get(id(t))) for t in tensors]).sum()
        for group in groups:
            dist.all_reduce(squares, op=dist.ReduceOp.SUM, group=group)
        total = total + squares
    norm = total.sqrt()
    scale = torch.clamp(max_norm / (norm + 1e-6), max=1.0)  # as torch.nn.utils.clip_grad_norm_
    for tensors in by_groups.values():
        for t in tensors:
            t.mul_(scale.to(t.dtype))
    return norm


def _squares(gradient: Tensor, row_weights: Tensor | None) -> Tensor:
    squares = gradient.float().pow(2)
    if row_weights is None:
        return squares.sum()
    return (squares.reshape(len(row_weights), -1).sum(1) * row_weights).sum()


def gathered_in_module_order(model: nn.Module, model_state: dict, optim_state: dict) -> tuple[dict, dict]:
    """Full state dicts of a tensor-parallel model with fused projections' rows in the module's order."""
    return _reordered(model, model_state, optim_state, restore_row_order)


def in_rank_order(model: nn.Module, model_state: dict, optim_state: dict) -> tuple[dict, dict]:
    """The inverse of :func:`gathered_in_module_order`: full state dicts laid out for the split model."""
    return _reordered(model, model_state, optim_state, put_in_rank_order)


def _reordered(model: nn.Module, model_state: dict, optim_state: dict,
               move: Callable[[Tensor, Tensor], Tensor]) -> tuple[dict, dict]:
    """Both state dicts with ``move(tensor, order)`` applied to every fused parameter and its row-shaped moments."""
    orders = fused_row_orders(model)
    model_state = {k: move(v, orders[k]) if k in orders else v for k, v in model_state.items()}
    states = {name: {k: move(v, orders[name]) if name in orders and _rowwise(v, orders[name]) else v
                     for k, v in entry.items()}
              for name, entry in optim_state.get("state", {}).items()}
    return model_state, {**optim_state, "state": states}


def _rowwise(value: object, order: Tensor) -> bool:
    # an optimizer state shaped like its parameter (moments), gathered or in the module's rows (fewer when units are
    # copied), not a scalar (step)
    return isinstance(value, Tensor) and value.dim() >= 1 and value.shape[0] in (len(order), int(order.max()) + 1)
