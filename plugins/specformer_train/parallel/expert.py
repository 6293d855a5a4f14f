"""Expert-parallel training: each MoE's experts split across data-parallel processes (``train.parallel.ep``).

The ``world`` processes of a run read different rows, as in data parallelism; they are
laid out ``[replica][ep]``: the ``ep`` consecutive processes of a replica form an
expert-parallel group (beside tensor parallelism, at each place of the tensor-parallel
groups: :func:`group_ranks`), over which every component that declares ``expert_parallel``
(:mod:`specformer.model.expert_parallel`) splits its experts, whole experts per process;
processes at the same place in every replica hold the same experts. The router,
attention, norms, embeddings and shared experts stay whole on every process.

An expert's gradient arrives by the all-to-all's backward already summed over the
tokens of its whole group, so it is kept out of the data-parallel average (DDP ignores
it, FSDP2 does not shard it) and finished here after the last micro-step
(:func:`finish_expert_gradients`): summed over the replicas and divided by the number of
processes reading different rows, which makes it the gradient of the mean loss over the
global batch, as one process would compute it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist
from torch import nn

from specformer.errors import UserError
from specformer.model.expert_parallel import expert_split_parameters


@dataclass
class ExpertLayout:
    """This process' expert-parallel groups and the parameters split over them."""

    group: Any  # the ep processes of this replica (a ProcessGroup)
    replicas: Any = None  # the processes holding the same experts, None when there is one replica
    params: dict[str, nn.Parameter] = field(default_factory=dict)  # split expert stacks by name
    text: str = ""  # what was split, in words


def group_ranks(world: int, ep: int, tp: int = 1) -> tuple[list[list[int]], list[list[int]]]:
    """The expert-parallel groups and the replica groups (same place in each) of ``world``.

    Ranks are laid out ``[dp][tp]``; the processes reading different rows (one per ``dp``
    index) at the same tensor-parallel place form the groups, ``ep`` consecutive ``dp``
    indices each: beside tensor parallelism, every place of the tensor-parallel groups runs
    its own expert parallelism (a mixture's tokens and experts are the same at every place).
    """
    dp = world // tp
    groups = [[(start + i) * tp + place for i in range(ep)] for place in range(tp) for start in range(0, dp, ep)]
    replicas = [[d * tp + place for d in range(slot, dp, ep)] for place in range(tp) for slot in range(ep)]
    return groups, replicas


def new_expert_groups(*, world: int, ep: int, rank: int, tp: int = 1) -> tuple[Any, Any]:
    """This process' expert-parallel group and replica group (None with one replica); every process calls this.

    Groups of their own, not the default one: the all-to-alls of the experts' backward then
    never interleave with the data-parallel all-reduces on the same communicator.
    """
    groups, replicas = group_ranks(world, ep, tp)
    mine, my_replicas = None, None
    for ranks in groups:
        made = dist.new_group(ranks)
        mine = made if rank in ranks else mine
    if world // tp > ep:
        for ranks in replicas:
            made = dist.new_group(ranks)
            my_replicas = made if rank in ranks else my_replicas
    return mine, my_replicas


def apply_expert_parallel(model: nn.Module, *, group: Any, replicas: Any = None) -> ExpertLayout:
    """Split the experts of every module that declares ``expert_parallel`` over ``group``.

    A misfit (experts that do not divide, no such module) is a UserError naming it.
    """
    ep = group.size()
    split: dict[str, int] = {}
    experts = None
    for name, module in model.named_modules():
        declare = getattr(module, "expert_parallel", None)
        if declare is None:
            continue
        try:
            declare(group)
        except ValueError as exc:
            raise UserError(f"train.parallel.ep {ep}: {name} ({type(module).__name__}): {exc}") from None
        split[type(module).__name__] = split.get(type(module).__name__, 0) + 1
        experts = getattr(module, "n_experts", experts)
    if not split:
        raise UserError(f"train.parallel.ep {ep}: this model has no component that splits its experts (a mixture of "
                        "experts, ffn kind moe); leave train.parallel.ep at 1")
    params = {name: param for name, (param, _) in expert_split_parameters(model).items()}
    told = ", ".join(f"{count} {kind}" for kind, count in sorted(split.items()))
    share = f", {experts // ep} of {experts} experts on each process" if isinstance(experts, int) else ""
    text = f"expert parallel {ep} ways: split {told}{share}"
    return ExpertLayout(group=group, replicas=replicas, params=params, text=text)


def finish_expert_gradients(layout: ExpertLayout, *, dp_size: int) -> None:
    """Expert gradients summed over the replicas, then divided by the processes reading different rows."""
    for param in layout.params.values():
        if param.grad is None:
            continue
        if layout.replicas is not None:
            dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, group=layout.replicas)
        param.grad.div_(dp_size)


def refuse_coupled_updates(optimizer: Any, layout: ExpertLayout) -> None:
    """A UserError when the optimizer updates an expert stack as one whole (Muon orthogonalises it as one matrix):
    a process holding some of the experts would compute another update than one holding all."""
    for group in optimizer.param_groups:
        if not group.get("use_muon"):
            continue
        held = {id(p) for p in group["params"]}
        coupled = [name for name, param in layout.params.items() if id(param) in held and param.dim() >= 2]
        if coupled:
            raise UserError(f"train.parallel.ep {layout.group.size()}: the muon optimizer orthogonalises each expert "
                            f"stack ({coupled[0]}) as one matrix across all its experts, which a process holding "
                            "some of them cannot do; use adamw, lion or sgd with expert parallelism")


def expert_groups_of(layout: ExpertLayout | None) -> dict[int, Any]:
    """``{id(parameter): its expert-parallel group}``: the gradients that differ across that group's processes."""
    if layout is None:
        return {}
    return {id(param): layout.group for param in layout.params.values()}
