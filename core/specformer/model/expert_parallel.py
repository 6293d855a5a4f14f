"""Expert parallelism declared by components: the contract, the dispatch by all-to-all and the bookkeeping.

A component takes part in expert parallelism (EP) by defining

    def expert_parallel(self, group: ProcessGroup) -> None: ...

which checks that its experts divide among the ``group``'s processes (a ``ValueError``
naming the numbers if not), keeps only its own contiguous range of whole experts
(process ``r`` of ``ep`` holds experts ``[r * E/ep, (r + 1) * E/ep)``) by calling
:func:`keep_local_experts`, and from then on computes its experts through
:func:`dispatch`: every process routes its own tokens, sends each (token, choice) copy
to the process that owns the chosen expert, runs its local experts on what it receives
and sends the results back. A component without the method is replicated.

:func:`keep_local_experts` records, on the component, which of its parameters it split
(stacked on dim 0, one row per expert, in rank order), so that the trainer can find them
without knowing the component (:func:`expert_split_parameters`): their gradients are
summed by the all-to-all's backward over the group's tokens and must not be averaged
with the data-parallel ones, and a checkpoint gathers them whole (:func:`gather_experts`)
and a resumed run keeps its rows (:func:`local_rows`).

The split sizes of the all-to-all are pure functions of the per-expert counts
(:func:`send_sizes`, :func:`by_local_expert`), tested without processes.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor, nn

#: What a component carries after :func:`keep_local_experts`: (its process group, names of its split parameters).
EXPERT_SPLIT = "_ep_split"


def local_range(n_experts: int, *, ep: int, rank: int) -> range:
    """The experts process ``rank`` of ``ep`` owns: a contiguous ``n_experts / ep`` of them."""
    if n_experts % ep:
        raise ValueError(f"n_experts {n_experts} does not divide among ep={ep} processes")
    share = n_experts // ep
    return range(rank * share, (rank + 1) * share)


def keep_local_experts(module: nn.Module, names: Sequence[str], group) -> range:
    """Replace ``module``'s stacked expert parameters ``names`` (None ones skipped) by this process' rows.

    Returns the experts kept; records the split on ``module`` (:data:`EXPERT_SPLIT`).
    """
    ep, rank = group.size(), group.rank()  # a ProcessGroup's size and this process' place in it
    kept: list[str] = []
    mine: range | None = None
    for name in names:
        param = getattr(module, name)
        if param is None:
            continue
        mine = local_range(param.shape[0], ep=ep, rank=rank)
        local = param.detach()[mine.start:mine.stop].clone()
        setattr(module, name, nn.Parameter(local, requires_grad=param.requires_grad))
        kept.append(name)
    if mine is None:
        raise ValueError("no expert parameters to split")
    setattr(module, EXPERT_SPLIT, (group, tuple(kept)))
    return mine


def expert_split_parameters(model: nn.Module) -> dict[str, tuple[nn.Parameter, object]]:
    """``{parameter name: (parameter, its expert-parallel group)}`` of every split expert stack, in module order."""
    found = {}
    for mname, module in model.named_modules():
        split = getattr(module, EXPERT_SPLIT, None)
        if split is None:
            continue
        group, names = split
        for name in names:
            found[f"{mname}.{name}" if mname else name] = (getattr(module, name), group)
    return found


def send_sizes(counts: Tensor, ep: int) -> Tensor:
    """Rows sent to each process ``(ep,)`` from the slots per expert ``(E,)`` (experts in contiguous ranges)."""
    return counts.view(ep, -1).sum(dim=1)


def by_local_expert(received: Tensor) -> Tensor:
    """The order that groups received rows by local expert.

    ``received (ep, E_local)``: rows from source ``s`` for local expert ``e``; they arrive
    source-major (each source's rows by expert). Returns the permutation ``p`` such that
    ``rows[p]`` is expert-major (each expert's rows by source), the order in which one
    process holding every expert would see them.
    """
    ep, local = received.shape
    expert_of_row = torch.arange(local, device=received.device).repeat(ep).repeat_interleave(received.flatten())
    return expert_of_row.argsort(stable=True)


def dispatch(grouped: Tensor, counts: Tensor, group, run_local: Callable[[Tensor, list[int]], Tensor]) -> Tensor:
    """Run the experts on slots held by their owners; the results back in this process' slot order.

    ``grouped (S, D)``: this process' (token, choice) copies sorted by expert, ``counts (E,)``
    how many go to each expert. ``run_local(rows, sizes)`` computes this process' experts on
    ``rows`` grouped by local expert (``sizes`` rows each). Differentiable: the backward
    sends the gradients the opposite way.
    """
    import torch.distributed as dist  # late: only an expert-parallel run needs collectives
    from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor

    def exchange(rows: Tensor, *, send: list[int], recv: list[int]) -> Tensor:
        return wait_tensor(all_to_all_single_autograd(rows, recv, send, group))

    ep = group.size()
    local = counts.shape[0] // ep
    received = torch.empty_like(counts)  # (ep * E_local,): from each source, its rows for each of our experts
    dist.all_to_all_single(received, counts, group=group)
    received = received.view(ep, local)
    send, recv = send_sizes(counts, ep).tolist(), received.sum(dim=1).tolist()
    rows = exchange(grouped, send=send, recv=recv)  # (M, D), source-major
    order = by_local_expert(received)
    expert_major = rows.index_select(0, order)
    out = run_local(expert_major, received.sum(dim=0).tolist())  # (M, D), expert-major
    back = torch.empty_like(out).index_copy(0, order, out)  # source-major again
    return exchange(back, send=recv, recv=send)  # (S, D)


def gather_experts(model: nn.Module, optimizer: torch.optim.Optimizer, model_state: dict,
                   optim_state: dict) -> tuple[dict, dict]:
    """Both full state dicts with every split expert stack (and its moments) gathered whole, in expert order.

    Every process of the groups takes part; entries are replaced only where the dicts hold
    them (under a CPU-offloaded gather, only the first process' do).
    """
    model_state, states = dict(model_state), dict(optim_state.get("state", {}))
    for name, (param, group) in expert_split_parameters(model).items():
        gathered = _gather_rows(param.detach(), group)
        if name in model_state:
            model_state[name] = gathered.to(model_state[name].device)
        moments = optimizer.state.get(param, {})
        for key in sorted(moments):
            value = moments[key]
            if not (isinstance(value, Tensor) and value.dim() >= 1 and value.shape[0] == param.shape[0]):
                continue  # a scalar (the step), the same on every process
            whole = _gather_rows(value, group)
            if name in states and key in states[name]:
                states[name] = {**states[name], key: whole.to(states[name][key].device)}
    return model_state, {**optim_state, "state": states}


def local_rows(model: nn.Module, model_state: dict, optim_state: dict) -> tuple[dict, dict]:
    """The inverse of :func:`gather_experts`: whole expert stacks cut to this process' rows.

    A stack whose length is not the split one's times the group's size is left as it is, for
    the shape check to name.
    """
    model_state, states = dict(model_state), dict(optim_state.get("state", {}))
    for name, (param, group) in expert_split_parameters(model).items():
        share, rank = param.shape[0], group.rank()
        whole = share * group.size()

        def cut(value: object) -> object:
            if isinstance(value, Tensor) and value.dim() >= 1 and value.shape[0] == whole:
                return value[rank * share:(rank + 1) * share].clone()
            return value

        if name in model_state:
            model_state[name] = cut(model_state[name])
        if name in states:
            states[name] = {key: cut(value) for key, value in states[name].items()}
    return model_state, {**optim_state, "state": states}


def _gather_rows(local: Tensor, group) -> Tensor:
    """Every process' ``local`` rows of the group, laid end to end in rank order."""
    import torch.distributed as dist  # late: only an expert-parallel run needs collectives

    parts = [torch.empty_like(local) for _ in range(group.size())]
    dist.all_gather(parts, local.contiguous(), group=group)
    return torch.cat(parts)
